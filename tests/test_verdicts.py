"""The checker can fail: broken strategies written against the public contract must be caught
(SILENT or LOUD, never RECOVERED), and a correct one must recover. Real ranks, real files."""
from __future__ import annotations

import pytest

from resilience.core.case import VerdictKind
from resilience.oracle.outcome import judge_case

from .harness_helpers import run_case

S = "tests.strategies_under_test:"
KILL_RANK1_TORN = {"kind": "kill", "rank": 1, "step": 8, "point": "write", "file": "*_rank_1.pt", "after_bytes": 4096}
KILL_IN_TRAINING = {"kind": "kill", "rank": 1, "step": 6, "phase": "train"}


@pytest.mark.parametrize("strategy, fault, overrides, expected, evidence", [
    ("ForgetsOptimizer", KILL_IN_TRAINING, {}, VerdictKind.SILENT, "optimizer.state"),
    ("RankZeroFileEverywhere", KILL_IN_TRAINING, {"workload": {"rank_rng": "distinct"}}, VerdictKind.SILENT,
     "rank 1: state"),
    # the rank that swallowed its load error waits in a barrier the other never reaches: a short
    # collective deadline ends the wait sooner; the verdict comes from the steps each rank restored
    ("IgnoresTornSave", KILL_RANK1_TORN, {"timeouts": {"collective": 15}}, VerdictKind.SILENT,
     "ranks restored different steps"),
    ("LoadsOldest", {**KILL_IN_TRAINING, "step": 10}, {"workload": {"steps": 12}}, VerdictKind.SILENT,
     "lost checkpoint"),
    ("SaveConsumesRandomness", {"kind": "none"}, {}, VerdictKind.SILENT, "first run"),
])
def test_broken_strategy_is_caught(tmp_path, strategy, fault, overrides, expected, evidence):
    result = run_case(tmp_path, strategy=S + strategy, fault=fault, **overrides)
    assert result.verdict.kind is expected, result.verdict.findings
    assert any(evidence in finding for finding in result.verdict.findings), result.verdict.findings
    assert judge_case(result).status == "failed"  # the scenario expected recovers


def test_silent_report_names_first_diverging_step(tmp_path):
    result = run_case(tmp_path, strategy=S + "ForgetsOptimizer", fault=KILL_IN_TRAINING)
    divergence = result.verdict.divergence
    # Step 5's loss comes before step 5's update (restored weights, right); the cold moments show at 6.
    assert divergence is not None and divergence.step == 6
    assert divergence.expected != divergence.got


def test_correct_user_strategy_recovers_past_a_torn_checkpoint(tmp_path):
    torn_temp_file = {**KILL_RANK1_TORN, "file": "*/ckpt_rank_1.tmp"}
    result = run_case(tmp_path, strategy=S + "AtomicFallbackSave", fault=torn_temp_file)
    assert result.fault_fired
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 4 == result.verdict.complete_step


def test_torn_file_without_fallback_is_loud(tmp_path):
    result = run_case(tmp_path, fault=KILL_RANK1_TORN, expect={"outcome": "fails_loudly"})
    assert result.verdict.kind is VerdictKind.LOUD
    assert result.verdict.first_error.rank == 1 and result.verdict.first_error.phase == "restart"
    assert "central directory" in result.verdict.first_error.message


def test_stalled_restore_is_a_hang_with_stacks(tmp_path):
    result = run_case(tmp_path, strategy=S + "StallsOnLoad", timeouts={"phase": 25, "collective": 120})
    assert result.verdict.kind is VerdictKind.HANG
    assert result.verdict.hung_phase == "restart"
    restart = result.phase("restart")
    assert "strategies_under_test.py" in restart.ranks[1].stderr_tail  # its stack, dumped by faulthandler
    where = "\n".join(result.verdict.findings)
    assert "rank 0: waiting in barrier" in where  # the peer that did nothing wrong, and where it waits
    assert "rank 1: at " in where and "in load" in where  # the culprit, outside any collective
    assert all(r.returncode is None for r in restart.ranks)  # torn down by the harness, none left


def test_loud_error_is_the_first_one_not_the_peers_consequence(tmp_path):
    """Rank 1 raises on restore; rank 0 then fails at the barrier. The evidence is rank 1's error."""
    result = run_case(tmp_path, fault=KILL_RANK1_TORN, expect="fails_loudly")
    assert result.verdict.first_error.rank == 1
    assert "Connection closed" not in result.verdict.first_error.message


def test_a_fault_event_without_a_byte_offset_renders():
    """A stalled or crashed writer fires at a file but at no byte: the report still renders it."""
    from resilience.report.text import fault_text

    event = {"kind": "overlapping_async", "rank": 1, "step": 5, "phase": "train", "file": "step_00000003/x"}
    assert fault_text(event) == "overlapping_async on rank 1 at step 5 train/None in step_00000003/x"
    assert fault_text({**event, "offset": 4096}).endswith("in step_00000003/x at byte 4096")
