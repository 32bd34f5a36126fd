"""The planted-bug catalogue's runs: one strategy in one catcher (`run_trial`, judged as `Trial`:
caught, accepted, not applicable or error), every built-in bug with its correct twin as the control
(`run_catalogue`), a strategy of the user's against the catchers cheapest first (`audit`), and the
caught / planted line (`summary`). `resilience planted` (`resilience.commands.planted`) prints them;
`resilience audit` (`resilience.planted.auditor`) judges its drawn scenarios with `run_trial` too.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.case import VerdictKind
from ..errors import ResilienceError, ScenarioError, Unavailable
from ..run.harness import Harness
from ..scenario.loader import load_document
from .catalogue import (
    ASYNC_BUG,
    CATCHERS,
    STATE_BUG,
    STORAGE_BUG,
    TWIN,
    WORKLOAD_BUG,
    Catcher,
    PlantedBug,
    catcher,
)

SOURCE = "resilience/planted/catalogue.py"
CAUGHT, ACCEPTED, NOT_APPLICABLE, ERROR = "caught", "accepted", "not applicable", "error"


@dataclass(frozen=True)
class Trial:
    """One strategy run in one catcher."""

    strategy: str  # as the scenario names it
    catcher: str
    judgement: str  # caught | accepted | not applicable | error
    verdict: str | None  # the case's verdict, when it ran
    evidence: str  # the first finding or error, or why the catcher does not apply
    seconds: float


def run_trial(harness: Harness, where: Catcher, strategy: Any, label: str) -> Trial:
    started = time.monotonic()

    def trial(judgement: str, verdict: str | None, evidence: str) -> Trial:
        return Trial(_strategy_label(strategy), where.name, judgement, verdict, evidence,
                     round(time.monotonic() - started, 1))

    try:
        case = load_document(where.scenario(strategy, label), f"{SOURCE}::{where.name}").cases[0]
    except ScenarioError as exc:  # e.g. a fault the strategy cannot take (no version stamp)
        return trial(NOT_APPLICABLE, None, str(exc))
    try:
        result = harness.run(case)
    except Unavailable as exc:
        return trial(NOT_APPLICABLE, None, str(exc))
    except ResilienceError as exc:
        return trial(ERROR, None, str(exc))
    verdict = result.verdict
    never_fired = case.fault.kind != "none" and not result.fault_acted
    if never_fired and verdict.kind not in (VerdictKind.SILENT, VerdictKind.HANG):  # a hang before it is one too
        why = result.fault_missed() or next((n for n in verdict.findings if n.startswith("@")), "") or (
            f"the strategy's files do not match {case.fault.trigger.file!r}")
        return trial(NOT_APPLICABLE, verdict.kind.value, f"the {case.fault.kind} fault never acted: {why}")
    if where.fallback_required and verdict.intact_step is not None:
        return trial(CAUGHT, verdict.kind.value, next(f for f in verdict.findings if f.startswith("refused;")))
    if verdict.kind in where.accepts:
        return trial(ACCEPTED, verdict.kind.value, "")
    allowed = " or ".join(sorted(v.value for v in where.accepts))
    evidence = (verdict.findings[0] if verdict.findings
                else f"{verdict.kind.value} where a correct strategy gives {allowed}")
    return trial(CAUGHT, verdict.kind.value, evidence)


def _strategy_label(strategy: Any) -> str:
    if isinstance(strategy, dict):
        options = ", ".join(f"{k}: {v}" for k, v in strategy.get("options", {}).items())
        return f"{strategy['name']} {{{options}}}" if options else strategy["name"]
    label = str(strategy)
    # a planted strategy is named by its class alone
    for module in (TWIN, STATE_BUG, STORAGE_BUG, ASYNC_BUG, WORKLOAD_BUG):
        label = label.removeprefix(module)
    return label


@dataclass(frozen=True)
class BugResult:
    bug: str
    failure_mode: str
    trials: tuple[Trial, ...]  # the planted strategy's, in the order run
    control: Trial | None  # the correct twin in the catcher that caught it (built-in bugs)

    @property
    def caught(self) -> bool:
        return any(t.judgement == CAUGHT for t in self.trials)

    @property
    def control_ok(self) -> bool:
        return self.control is None or self.control.judgement == ACCEPTED


def run_catalogue(harness: Harness, bugs: tuple[PlantedBug, ...], controls: bool,
                  report: Callable[[str], None]) -> list[BugResult]:
    control_trials: dict[tuple[str, str], Trial] = {}
    results = []
    for bug in bugs:
        where = catcher(bug.catcher)
        planted = run_trial(harness, where, bug.strategy, bug.name)
        control = None
        if controls:
            key = (where.name, json.dumps(bug.control, sort_keys=True))
            if key not in control_trials:
                control_trials[key] = run_trial(harness, where, bug.control, f"control of {bug.name}")
            control = control_trials[key]
        results.append(BugResult(bug.name, bug.failure_mode, (planted,), control))
        report(_line(results[-1]))
    return results


def audit(harness: Harness, strategy: str, every: bool, report: Callable[[str], None]) -> BugResult:
    """A strategy of the user's, planted as a bug: the catchers cheapest first, until one catches it."""
    trials = []
    for where in CATCHERS:
        trials.append(run_trial(harness, where, strategy, strategy))
        last = trials[-1]
        report(f"    {where.name:<18} {last.judgement:<14} {last.verdict or '-':<9} {last.evidence[:120]}")
        if last.judgement == CAUGHT and not every:
            break
    result = BugResult(strategy, "planted by the user", tuple(trials), None)
    report(_line(result))
    return result


def _line(result: BugResult) -> str:
    caught = next((t for t in result.trials if t.judgement == CAUGHT), None)
    if caught is None:
        ran = "; ".join(f"{t.catcher}: {t.judgement} {t.verdict or ''} {t.evidence[:160]}" for t in result.trials)
        return f"MISSED  {result.bug:<31} {ran}"
    line = f"CAUGHT  {result.bug:<31} by {caught.catcher:<17} {caught.verdict:<9} {caught.evidence[:110]}"
    if result.control is not None:
        status = "ok" if result.control_ok else f"NOT ACCEPTED: {result.control.evidence[:110]}"
        line += f"\n        control {result.control.strategy}: {result.control.verdict or '-'} ({status})"
    return line


def summary(results: list[BugResult]) -> str:
    caught = sum(r.caught for r in results)
    controls = [r.control for r in results if r.control is not None]
    distinct_controls = {(c.catcher, c.strategy): c for c in controls}.values()
    accepted = sum(c.judgement == ACCEPTED for c in distinct_controls)
    percent = 100 * caught // len(results) if results else 0
    text = f"caught/planted = {caught}/{len(results)} ({percent}%)"
    if distinct_controls:
        text += f"; controls accepted = {accepted}/{len(distinct_controls)}"
    return text
