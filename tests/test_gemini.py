"""lm-resiliency's GEMINI as the system under test (strategy gemini): every phase runs with
lm-resiliency 0.2.0 layered over this environment, installed once from the package index into the
packages cache (a machine that cannot reach it skips, with the reason; CI=true fails that skip)."""
from __future__ import annotations

import pytest

from resilience.core.case import Software, VerdictKind
from resilience.core.events import Event
from resilience.strategies.gemini import PACKAGES

from .harness_helpers import case_from, layered_or_skip, run_case

PACED = {"model": "mlp", "world_size": 2, "steps": 8, "checkpoint_every": 2, "seed": 0,
         "options": {"step_seconds": 0.3}}
TWO_NODES = {**PACED, "world_size": 4}


@pytest.fixture
def gemini_layered():
    layered_or_skip(PACKAGES, "lm-resiliency")


def test_every_phase_of_a_gemini_case_runs_with_its_package_layered():
    assert case_from(strategy="gemini", workload=PACED).software == Software(packages=PACKAGES)


def test_the_survivor_flushes_its_peers_replica_and_the_restart_restores_it(tmp_path, gemini_layered):
    result = run_case(tmp_path, keep=True, strategy="gemini", workload=PACED,
                      fault={"kind": "kill", "rank": 1, "step": 8, "phase": "train"})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 6
    # rank 1 died before writing anything: its step-6 file is the replica rank 0 held and flushed
    shards = sorted(p.relative_to(result.work_dir / "checkpoints").parts[-2:]
                    for p in (result.work_dir / "checkpoints").rglob("rank-*.pt"))
    assert ("step-6", "rank-1.pt") in shards and ("step-6", "rank-0.pt") in shards
    assert {e["versions"]["lm-resiliency"] for e in result.phase("restart").events(Event.JOINED)} == {"0.2.0"}


def test_a_node_lost_with_its_replicas_leaves_nothing_every_rank_holds(tmp_path, gemini_layered):
    """J = 1 on two ranks per node: ranks 2 and 3 replicate each other and die together. load()
    returns None, the job starts over: accepted only where falling back is (fallback_ok)."""
    lost = {"kind": "node_loss", "rank": 3, "step": 8, "phase": "train"}
    result = run_case(tmp_path, strategy={"name": "gemini", "options": {"replication_jump": 1}},
                      workload=TWO_NODES, topology={"nodes": 2}, fault=lost)
    assert result.verdict.kind is VerdictKind.SILENT and result.verdict.restored_step == 0
    assert "lost checkpoint: restored step 0" in result.verdict.findings[0]
    crossed = run_case(tmp_path, strategy="gemini", workload=TWO_NODES, topology={"nodes": 2}, fault=lost)
    assert crossed.verdict.kind is VerdictKind.RECOVERED and crossed.verdict.restored_step == 6  # J = 2
