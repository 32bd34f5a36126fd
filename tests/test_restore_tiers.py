"""The oracle's check of a restore from two tiers (memory and storage, `RESTORE_TIERS`): every rank
must restore the same step from the same tier. Shown on the planted two-tier checkpoint
(`resilience.planted.tier_bugs`): its twin passes, and the copy whose last rank reads storage
(the same step, a valid state) is SILENT for that reason alone."""
from __future__ import annotations

from resilience.core.case import VerdictKind
from resilience.oracle.rules import tier_findings

from .harness_helpers import run_case

TWIN, BUG = "resilience.planted.tier_bugs:TwoTierSave", "resilience.planted.tier_bugs:LastRankFromStorage"
KILLED = {"workload": {"model": "mlp", "world_size": 2, "steps": 12, "checkpoint_every": 4, "seed": 0,
                       "rank_rng": "distinct"},
          "fault": {"kind": "kill", "rank": 1, "step": 10, "phase": "train"}}


def test_a_restore_from_one_tier_passes_and_a_mix_is_silent():
    assert tier_findings({0: {"tier": "memory"}, 1: {"tier": "memory"}}) == []
    assert tier_findings({0: {"step": 8}, 1: {"step": 8}}) == []  # a strategy with one tier says none
    found = tier_findings({0: {"tier": "memory"}, 1: {"tier": "storage"}})
    assert found and "{0: 'memory', 1: 'storage'}" in found[0]


def test_the_twin_restores_every_rank_from_memory_without_reading_storage(tmp_path):
    result = run_case(tmp_path, strategy=TWIN, **KILLED)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 8
    assert result.restored_from == "memory" and result.storage_bytes_read == 0


def test_one_rank_restored_from_storage_is_silent_though_its_state_is_valid(tmp_path):
    result = run_case(tmp_path, strategy=BUG, **KILLED)
    assert result.verdict.kind is VerdictKind.SILENT
    # the tier check alone: the same step everywhere, and every rank's state equal to the reference's
    assert result.verdict.findings[0].startswith("ranks restored from different tiers: {0: 'memory', 1: 'storage'}")
    assert len(result.verdict.findings) == 1 and not result.verdict.state_diff and not result.verdict.divergence
    assert result.restored_from == "0: memory, 1: storage" and result.storage_bytes_read > 0


def test_a_lost_node_takes_the_memory_tier_and_every_rank_restores_storage(tmp_path):
    result = run_case(tmp_path, strategy={"name": TWIN, "options": {"storage_every": 4}},
                      workload=KILLED["workload"], fault={"kind": "node_loss", "rank": 0, "step": 10, "phase": "train"})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.restored_from == "storage" and result.storage_bytes_read > 0


def test_node_agents_end_with_the_job_and_are_replaced_only_where_another_launch_follows(tmp_path):
    """Real agent processes (the planted two-tier checkpoint's): after a completed launch they end,
    and new ones start only where another launch follows (an explorer's power cut takes them)."""
    from resilience.core.records import PhaseStatus
    from resilience.run.node_agents import NodeAgents

    agents = NodeAgents("resilience.planted.memory_agent", tmp_path / "agents", (0,), {})
    try:
        agents.start()
        first = agents.processes[0]
        agents.after_launch(PhaseStatus.COMPLETED)
        second = agents.processes[0]
        assert first.poll() is not None and second.poll() is None  # the job ended; the next job's agent serves
        agents.after_launch(PhaseStatus.COMPLETED, another=False)
        assert not agents.processes and second.poll() is not None
        agents.start()
        third = agents.processes[0]
        agents.after_launch(PhaseStatus.FAILED, another=False)  # a failure's duties done, nothing replaces it
        assert not agents.processes and third.poll() is not None
    finally:
        agents.stop()
