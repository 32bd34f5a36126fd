"""Does a case pass? Its verdict against the scenario's expectation and known issue."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.case import Case, VerdictKind
from ..core.records import CaseResult, Verdict
from ..core.script_case import ScriptCase
from ..core.wire import WireName


class CaseStatus(WireName):
    """What became of a case: a str, so a report is plain JSON. The oracle gives the first three; a
    case that could not run is ``skipped`` (something it needs is missing) or ``error`` (the harness)."""

    PASSED = "passed"
    FAILED = "failed"
    XFAILED = "xfailed"  # the scenario's known issue reproduced
    SKIPPED = "skipped"
    ERROR = "error"


@dataclass(frozen=True)
class CaseOutcome:
    status: CaseStatus  # PASSED, FAILED or XFAILED
    reason: str


def judge_case(result: CaseResult) -> CaseOutcome:
    return judge_outcome(result.case, result.verdict, result.fault_fired)


def judge_outcome(case: Case | ScriptCase, verdict: Verdict, fault_fired: bool) -> CaseOutcome:
    """A case on the framework's strategies or on a user's script: the same rules."""
    if case.fault.kind != "none" and not fault_fired:
        return CaseOutcome(CaseStatus.FAILED, f"the {case.fault.kind} fault never fired: its trigger "
                                     f"{case.fault.trigger} was never reached, so the case tested nothing")
    matches = verdict.kind is case.expect.verdict
    if matches and case.expect.error and verdict.kind is VerdictKind.LOUD:
        text = verdict.first_error.summary() if verdict.first_error else ""
        if not re.search(case.expect.error, text):
            matches = False
            mismatch = f"the error {text!r} does not match /{case.expect.error}/"
    if matches and case.expect.fallback_required and verdict.intact_step is not None:
        refusal = (f"the restore refused although step {verdict.intact_step} was intact "
                   "(restored and verified in fresh ranks)")
        if case.known_issue and case.known_issue.verdict is VerdictKind.LOUD:  # the refusal is what is pinned
            issue = case.known_issue
            return CaseOutcome(CaseStatus.XFAILED, f"known issue (LOUD, {refusal}): {issue.reason} {issue.link}")
        return CaseOutcome(CaseStatus.FAILED, f"fallback required: {refusal}")
    if case.known_issue:
        issue = case.known_issue
        if verdict.kind is issue.verdict:
            return CaseOutcome(CaseStatus.XFAILED, f"known issue ({issue.verdict.value}): {issue.reason} {issue.link}")
        if matches:
            return CaseOutcome(CaseStatus.FAILED, f"the known issue no longer reproduces: expected "
                               f"{issue.verdict.value} ({issue.link}) but the case now gives {verdict.kind.value}; "
                               "remove known_issue from the scenario")
    if matches:
        return CaseOutcome(CaseStatus.PASSED, "")
    if verdict.kind is case.expect.verdict:
        return CaseOutcome(CaseStatus.FAILED, mismatch)
    return CaseOutcome(CaseStatus.FAILED, f"verdict {verdict.kind.value}, expected {case.expect.verdict.value}")
