"""Availability inside LOUD: a refused restore beside an intact older checkpoint, proven by
restoring that step in fresh ranks, and `expect: {fallback: required}`."""
from __future__ import annotations

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import ScenarioError
from resilience.oracle.outcome import judge_case

from .harness_helpers import case_from, run_case

REFUSED = {"kind": "crash", "how": "os_exit", "rank": 1, "step": 8, "phase": "save"}  # before its step-8 file


def test_fallback_takes_optional_or_required():
    with pytest.raises(ScenarioError, match=r"expect.fallback.*got 'always'.*allowed: optional, required"):
        case_from(expect={"outcome": "fails_loudly", "fallback": "always"})


def test_a_refusal_beside_an_intact_step_fails_only_where_fallback_is_required(tmp_path):
    result = run_case(tmp_path, fault=REFUSED, workload={"steps": 12},
                      expect={"outcome": "fails_loudly", "fallback": "required"}, timeouts={"phase": 60})
    verdict = result.verdict
    assert verdict.kind is VerdictKind.LOUD and verdict.intact_step == 4 and verdict.restored_step is None
    assert "refused; step 4 was intact and never tried" in "\n".join(verdict.findings)
    probes = [p for p in result.phases if p.name == "fallback"]
    assert probes and all(e["step"] == 4 for e in probes[-1].events("restored"))  # restored in fresh ranks
    outcome = judge_case(result)
    assert outcome.status == "failed" and "fallback required" in outcome.reason
    optional = type(result)(case=case_from(fault=REFUSED, workload={"steps": 12}, expect="fails_loudly"),
                            verdict=verdict, phases=result.phases, work_dir=result.work_dir)
    assert judge_case(optional).status == "passed"
    pinned = type(result)(case=case_from(fault=REFUSED, workload={"steps": 12},
                                         expect={"outcome": "fails_loudly", "fallback": "required"},
                                         known_issue={"verdict": "LOUD", "reason": "refuses", "link": "https://x"}),
                          verdict=verdict, phases=result.phases, work_dir=result.work_dir)
    outcome = judge_case(pinned)
    assert outcome.status == "xfailed" and "step 4 was intact" in outcome.reason  # a pinned refusal


def test_no_older_checkpoint_means_nothing_to_fall_back_to(tmp_path):
    result = run_case(tmp_path, fault={**REFUSED, "step": 4},
                      expect={"outcome": "fails_loudly", "fallback": "required"}, timeouts={"phase": 60})
    assert result.verdict.kind is VerdictKind.LOUD and result.verdict.intact_step is None
    assert not [p for p in result.phases if p.name == "fallback"]  # no complete checkpoint to try
    assert judge_case(result).status == "passed"
