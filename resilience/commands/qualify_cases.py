"""Which cases `resilience qualify` runs, and how each becomes a record of the report: a case on
the framework's strategies through the chosen launcher, a case on a user's script through
black-box mode (always under torchrun: the script's own launcher)."""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from ..core.case import Case
from ..core.directory_cache import DirectoryCache
from ..core.script_case import ScriptCase
from ..errors import ResilienceError, Unavailable
from ..oracle.outcome import CaseStatus, judge_case, judge_outcome
from ..report.qualification import CaseRecord
from ..run.blackbox import run_script_case
from ..scenario import selection
from ..scenario.discovery import load_all_cases


def keyword_filter(expression: str | None) -> Callable[[Case | ScriptCase], bool]:
    """pytest's -k language over the words that name a case (its id, file, name, strategy or
    script, fault), and ``case(key=value, ...)`` over its values (`scenario.selection`)."""
    if not expression:
        return lambda case: True
    from _pytest.mark.expression import (
        Expression,  # the same grammar users know from pytest
    )

    try:
        compiled = Expression.compile(expression)
    except Exception as exc:  # pytest's ParseError: a malformed expression
        raise ResilienceError(f"-k {expression!r}: {exc}; allowed: words joined by and, or, not and "
                              "parentheses, each matched as a substring of a case's id, file, strategy or "
                              f"fault, or {selection.MARKER}(key=value, ...) over its values") from None

    unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", expression)  # a value's own parentheses are not a call
    called = set(re.findall(r"([^\s()]+)\s*\(", unquoted)) - {"and", "or", "not", selection.MARKER}
    if called:
        raise ResilienceError(f"-k {expression!r}: {', '.join(sorted(called))}(...) names nothing; allowed: "
                              f"{selection.MARKER}(key=value, ...) over a case's values")

    def selected(case: Case | ScriptCase) -> bool:
        words = [case.id, case.source, Path(case.source).name, case.name, selection.system_name(case), case.fault.kind]

        def matches(name: str, **values) -> bool:
            if not values:
                return any(name.lower() in word.lower() for word in words)
            own = selection.selection_values(case)
            return all(key in own and own[key] == value for key, value in values.items())

        return compiled.evaluate(matches)

    return selected


def select(paths: list[str], expression: str | None, deep: bool = False) -> tuple[list[Case | ScriptCase], list[str]]:
    """The selected cases (those of the deep tier only with ``deep``), and the load errors of files
    that could not be read (each names the file)."""
    chosen = keyword_filter(expression)
    return load_all_cases(paths, lambda case: chosen(case) and (deep or case.tier != "deep"))


def record_of(case: Case | ScriptCase, run_case: Callable[[Case], object], work_root: Path | None,
              cache: DirectoryCache | None) -> CaseRecord:
    """Run one case; its record, a skip or an error included."""
    started = time.monotonic()
    try:
        if isinstance(case, ScriptCase):
            result = run_script_case(case, work_root=work_root, cache=cache)
            restored = result.verdict.restored_step or 0  # the restart counts its steps from there
            losses = {"reference": result.reference[0].step_losses(), "first_run": result.first_run[0].step_losses(),
                      "restart": result.restart[0].step_losses(restored) if result.restart else {}}
            outcome = judge_outcome(case, result.verdict, result.fault_fired)
            return CaseRecord.of_script(case, result.verdict, outcome, time.monotonic() - started, losses)
        result = run_case(case)
        return CaseRecord.of(result, judge_case(result), time.monotonic() - started)
    except Unavailable as exc:
        return CaseRecord.not_run(case, CaseStatus.SKIPPED, str(exc), time.monotonic() - started)
    except ResilienceError as exc:
        return CaseRecord.not_run(case, CaseStatus.ERROR, str(exc), time.monotonic() - started)


def run_cases(cases: list[Case | ScriptCase], run_case: Callable[[Case], object], progress,
              work_root: Path | None = None, cache: DirectoryCache | None = None) -> list[CaseRecord]:
    records = []
    for index, case in enumerate(cases, 1):
        record = record_of(case, run_case, work_root, cache)
        records.append(record)
        verdict = record.verdict or "-"
        print(f"[{index:>{len(str(len(cases)))}}/{len(cases)}] {record.status.upper():<7} {verdict:<9} "
              f"(expected {record.expected:<9}) {record.elapsed_s:6.1f} s  {record.label}", file=progress, flush=True)
        if record.status in (CaseStatus.FAILED, CaseStatus.ERROR, CaseStatus.SKIPPED):
            print(f"    {record.reason.splitlines()[0] if record.reason else ''}", file=progress, flush=True)
    return records
