"""Version stamps: what each strategy records, and what its restore does with another one."""
from __future__ import annotations

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import ScenarioError
from resilience.faults.base import CaseEnvironment, Fault
from resilience.strategies.torch.native import CLAIMS, restamp

from .harness_helpers import case_from, run_case


class RestampByHand(Fault):
    """The operator's hands between the runs: the newest torch.rank0 file restamped as format 99."""

    kind = "tests.test_version:RestampByHand"
    needs_trigger = False

    def heal(self, env: CaseEnvironment) -> None:
        newest = max(env.checkpoint_dir.glob("step_*/model_optim.pt"))
        restamp(newest, "newer")


def test_a_stamp_rewritten_by_hand_is_refused_by_a_checking_restore(tmp_path):
    result = run_case(tmp_path, strategy={"name": "torch.rank0", "options": {"check_version": True}},
                      fault={"kind": RestampByHand.kind}, expect="fails_loudly")
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    error = result.verdict.first_error
    assert error.phase == "restart" and "'format': 99" in error.message and "understands format 1" in error.message


def test_the_seed_schemes_load_whatever_version_a_file_claims(tmp_path):
    result = run_case(tmp_path, strategy="torch.rank0", fault={"kind": RestampByHand.kind})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings


def test_the_fault_restamps_every_rank_and_stops_the_job_there(tmp_path):
    result = run_case(tmp_path, strategy="torch.per_rank", workload={"steps": 12},
                      fault={"kind": "version_mismatch", "rank": 1, "step": 8, "phase": "save", "version": "older"})
    assert result.verdict.kind is VerdictKind.RECOVERED and result.verdict.restored_step == 8
    fired = sorted((e["rank"], tuple(e["files"]), e["ends_process"]) for e in result.phases[1].fault_events)
    assert fired == [(0, ("step_00000008/ckpt_rank_0.pt",), False), (1, ("step_00000008/ckpt_rank_1.pt",), True)]
    assert CLAIMS["older"]["format"] == 0


def test_version_mismatch_without_a_version_anywhere_says_so_and_never_fires(tmp_path):
    # no records_version and no version field in any file (the no-op writes none): nothing to restamp
    result = run_case(tmp_path, strategy="none", workload={"steps": 4},
                      fault={"kind": "version_mismatch", "rank": 0, "step": 4, "phase": "save"})
    assert not result.fault_fired and "carries a version field" in result.fault_missed()


def test_version_claims_are_validated():
    with pytest.raises(ScenarioError) as info:
        case_from(fault={"kind": "version_mismatch", "rank": 0, "step": 4, "phase": "save", "version": "ancient"})
    assert "fault.version" in str(info.value) and "older, newer" in str(info.value)
