"""`resilience planted`: run every planted bug in the case that must catch it, and each catcher with
the bug's correct twin (the control), then print caught / planted.

``--strategy TARGET`` plants bugs of your own (any strategy written against the contract): each meets
the catchers cheapest first until one catches it (``--all``: every catcher). The exit status is 0
when every planted bug is caught and every control accepted.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ResilienceError, ScenarioError, Unavailable
from ..run.harness import Harness
from ..scenario.loader import load_document
from ..core.case import VerdictKind
from .catalogue import ASYNC_BUG, BUGS, CATCHERS, STATE_BUG, STORAGE_BUG, TWIN, Catcher, PlantedBug, catcher

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
    evidence = verdict.findings[0] if verdict.findings else f"{verdict.kind.value} where a correct strategy gives {allowed}"
    return trial(CAUGHT, verdict.kind.value, evidence)


def _strategy_label(strategy: Any) -> str:
    if isinstance(strategy, dict):
        options = ", ".join(f"{k}: {v}" for k, v in strategy.get("options", {}).items())
        return f"{strategy['name']} {{{options}}}" if options else strategy["name"]
    label = str(strategy)
    for module in (TWIN, STATE_BUG, STORAGE_BUG, ASYNC_BUG):  # a planted strategy is named by its class alone
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
        report(f"    {where.name:<18} {trials[-1].judgement:<14} {trials[-1].verdict or '-':<9} {trials[-1].evidence[:120]}")
        if trials[-1].judgement == CAUGHT and not every:
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", action="append", default=[], metavar="TARGET",
                        help="plant a strategy of your own (package.module:Class), repeatable; "
                             "with it, the built-in catalogue runs only with --catalogue")
    parser.add_argument("--catalogue", action="store_true", help="run the built-in catalogue with --strategy too")
    parser.add_argument("--only", action="append", default=[], metavar="BUG",
                        help="run only this built-in bug, repeatable: " + ", ".join(b.name for b in BUGS))
    parser.add_argument("--all", action="store_true", help="run a --strategy in every catcher, not only "
                                                           "until the first catch")
    parser.add_argument("--no-controls", action="store_true", help="skip the correct twins")
    parser.add_argument("--json", type=Path, help="also write every trial to this file")


def main(args: argparse.Namespace, harness: Harness) -> int:
    unknown = sorted(set(args.only) - {b.name for b in BUGS})
    if unknown:
        print(f"ERROR --only: unknown planted bug {', '.join(unknown)}; "
              f"allowed: {', '.join(b.name for b in BUGS)}", flush=True)
        return 2
    report = lambda line: print(line, flush=True)
    results: list[BugResult] = []
    if args.catalogue or args.only or not args.strategy:
        bugs = tuple(b for b in BUGS if not args.only or b.name in args.only)
        results += run_catalogue(harness, bugs, not args.no_controls, report)
    for strategy in args.strategy:
        report(f"planted {strategy}:")
        results.append(audit(harness, strategy, args.all, report))
    print(summary(results), flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"caught": r.caught} for r in results], indent=1))
    return 0 if all(r.caught and r.control_ok for r in results) else 1
