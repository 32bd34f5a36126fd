"""The stall fault: a real SIGSTOP of a rank in its peers' collective, a SIGCONT from the harness."""
from __future__ import annotations

from resilience.core.case import VerdictKind

from .harness_helpers import run_case

TIMEOUT_S = 15
MARGIN_S = 10  # a rank notices a timed-out collective on its next poll; 2 loaded cores add more


def stall(seconds, phase="save", step=8):
    return {"kind": "stall", "rank": 1, "step": step, "phase": phase, "seconds": seconds}


def test_stall_shorter_than_the_timeout_only_delays(tmp_path):
    result = run_case(tmp_path, fault=stall(3), timeouts={"collective": TIMEOUT_S})
    first_run = result.phases[1]
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert first_run.status == "completed" and first_run.elapsed_s >= 3
    assert [e["rank"] for e in first_run.fault_events] == [1]


def test_stall_longer_than_the_timeout_is_loud_within_the_timeout_plus_a_margin(tmp_path):
    result = run_case(tmp_path, fault=stall(25, phase="train", step=6), timeouts={"collective": TIMEOUT_S},
                      expect="fails_loudly")
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    error = result.verdict.first_error
    assert error.rank == 0 and "Timed out" in error.message
    stalled_at = result.phases[1].fault_events[0]["time"]
    assert TIMEOUT_S - 1 <= error.time - stalled_at <= TIMEOUT_S + MARGIN_S


def test_stall_past_the_phase_deadline_is_a_hang_that_names_the_stopped_rank(tmp_path):
    """No collective timeout fires before the deadline: nobody failed, so HANG, not LOUD."""
    result = run_case(tmp_path, fault=stall(300), timeouts={"collective": 600, "phase": 20})
    assert result.verdict.kind is VerdictKind.HANG
    findings = "\n".join(result.verdict.findings)
    assert "rank 1: stopped (SIGSTOP)" in findings
    assert "rank 0: waiting in barrier" in findings


def test_stall_of_a_whole_node_freezes_every_rank_on_it_and_resumes_them_together(tmp_path):
    """scope: node: rank 2 stops itself in the step-8 save, the harness stops rank 3 (its node-mate)
    at once and resumes both 3 s later; rank 3's own save resumes only then."""
    result = run_case(tmp_path, fault={**stall(3), "rank": 2, "scope": "node"}, timeouts={"collective": TIMEOUT_S},
                      workload={"world_size": 4, "global_batch": 8}, topology={"nodes": 2})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert ("node 1 frozen: rank 2 stopped itself, ranks [3] stopped with it (found stopped when resumed: [3])"
            in "\n".join(result.verdict.findings)), result.verdict.findings
    first_run = result.phases[1]
    fired = first_run.fault_events[0]["time"]
    saved = {r: e["time"] for r in (0, 1, 3) for e in first_run.ranks[r].events
             if e["event"] == "save_returned" and e["step"] == 8}
    assert all(t >= fired + 3 for t in saved.values()), (fired, saved)
