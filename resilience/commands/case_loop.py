"""What `run`, `explore`, `repeat` and `torchrun` share: load the cases of the named paths, run
each, print one line per case (and the report of each failure), count failures. A case skipped
for a missing component counts as a failure under CI (``CI=true``), as under pytest: a missing
install step must not hide.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from ..core.case import Case
from ..core.records import CaseResult
from ..core.script_case import ScriptCase
from ..errors import ResilienceError, Unavailable
from ..oracle.outcome import CaseStatus, judge_case, judge_outcome
from ..report.text import render, verdict_line
from ..run.blackbox_records import BlackBoxResult, describe
from ..scenario.discovery import load_all_cases, script_files


def skips_fail() -> bool:
    """Whether a skipped case fails the run: under CI, where every component must be installed."""
    return os.environ.get("CI") == "true"


def selection(case_id: str | None, deep: bool) -> Callable[[Case], bool]:
    """Which cases `run`, `explore` and `repeat` take: the one named by ``case_id`` (whatever its
    tier), or every case but those of the deep tier, which only ``deep`` adds (as ``pytest -m
    deep`` and ``qualify --deep`` do)."""
    if case_id:
        return lambda case: case.id == case_id
    return lambda case: deep or case.tier != "deep"


def load_or_report(paths: Iterable[str], selected: Callable[[Case], bool] = lambda case: True,
                   scripts: bool = False) -> tuple[list[Case], int]:
    """The selected cases (``scripts``: those on users' scripts too), and how many files could not
    be loaded (each error printed)."""
    try:
        cases, errors = load_all_cases(paths, selected, scripts=scripts)
    except ResilienceError as exc:  # a path that does not exist
        cases, errors = [], [str(exc)]
    for error in errors:
        print(f"ERROR {error}", flush=True)
    if not scripts:  # said, so that a file left out is never mistaken for one that passed
        for path in script_files(paths):
            print(f"NOTE {path}: cases on a user's script run under pytest, `resilience run` and `qualify`, "
                  "not this command", flush=True)
    return cases, len(errors)


def run_and_report(cases: Iterable[Case | ScriptCase], run_case: Callable[[Case], CaseResult],
                   show_findings: bool = False,
                   run_script: Callable[[ScriptCase], BlackBoxResult] | None = None) -> int:
    """Run every case, print its outcome; the number of failures. ``show_findings``: print a passing
    case's findings too (exploration summaries); ``run_script``: how a case on a user's script runs."""
    failures = 0
    for case in cases:
        if isinstance(case, ScriptCase):
            if run_script is None:
                raise TypeError(f"{case.source}[{case.id}] is a case on a user's script: pass run_script")
            failures += _run_script_case(case, run_script)
            continue
        try:
            result = run_case(case)
        except Unavailable as exc:
            print(f"SKIPPED {case.source}[{case.id}]: {exc}", flush=True)
            failures += skips_fail()
            continue
        except ResilienceError as exc:
            print(f"ERROR {case.source}[{case.id}]: {exc}", flush=True)
            failures += 1
            continue
        outcome = judge_case(result)
        print(f"{outcome.status.upper():<6} {verdict_line(result)}", flush=True)
        if show_findings and outcome.status != CaseStatus.FAILED:
            print("\n".join(f"       {line}" for line in result.verdict.findings), flush=True)
        if outcome.status == CaseStatus.FAILED:
            failures += 1
            print(render(result, outcome.reason), flush=True)
    return failures


def _run_script_case(case: ScriptCase, run_script: Callable[[ScriptCase], BlackBoxResult]) -> int:
    """One case on a user's script, judged by the same rules; 1 if it failed."""
    name = f"{case.source}[{case.id}]"
    try:
        result = run_script(case)
    except Unavailable as exc:
        print(f"SKIPPED {name}: {exc}", flush=True)
        return int(skips_fail())
    except ResilienceError as exc:
        print(f"ERROR {name}: {exc}", flush=True)
        return 1
    outcome = judge_outcome(case, result.verdict, result.fault_fired)
    restored = "-" if result.verdict.restored_step is None else result.verdict.restored_step
    print(f"{outcome.status.upper():<6} {result.verdict.kind.value:<9} expected {case.expect.verdict.value:<9} "
          f"{name} (restored step {restored}, newest complete {result.verdict.complete_step})", flush=True)
    if outcome.status != CaseStatus.FAILED:
        return 0
    print(f"{outcome.reason}\n{describe(result)}", flush=True)
    return 1
