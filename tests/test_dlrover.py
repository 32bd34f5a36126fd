"""DLRover's flash checkpoint as the system under test (strategy dlrover_flash): every phase and the
node agents run with DLRover 0.6.1 layered over this environment, installed once from the package
index into the packages cache (a machine that cannot reach it skips, with the reason; CI=true fails
that skip)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from resilience.core.case import Software, VerdictKind
from resilience.core.events import Event
from resilience.core.node_agents import SHARED_MEMORY, agent_dir, agent_name
from resilience.core.plan import RESTART
from resilience.errors import ScenarioError
from resilience.faults.write_path.power_loss import trace_dir
from resilience.strategies.dlrover import PACKAGES

from .harness_helpers import case_from, layered_or_skip, run_case

FLASH = {"name": "dlrover_flash", "options": {"copy_restored": True}}
PACED = {"model": "mlp", "world_size": 2, "steps": 8, "checkpoint_every": 2, "seed": 0,
         "options": {"step_seconds": 0.3}}


@pytest.fixture
def dlrover_layered():
    layered_or_skip(PACKAGES, "DLRover")


def test_every_phase_of_a_dlrover_case_runs_with_its_packages_layered():
    case = case_from(strategy=FLASH, workload=PACED)
    assert case.software == Software(packages=PACKAGES) and PACKAGES[0] == "dlrover==0.6.1"


def test_a_kill_in_a_memory_copy_is_refused_where_the_strategy_has_no_in_memory_tier():
    with pytest.raises(ScenarioError) as info:
        case_from(strategy="torch.rank0", workload=PACED,
                  fault={"kind": "kill", "rank": 0, "step": 6, "phase": "save", "point": "memory_copy"})
    assert "fault.point" in str(info.value) and "dlrover_flash" in str(info.value), str(info.value)


def test_bad_dlrover_options_are_refused_by_name():
    with pytest.raises(ScenarioError, match="strategy.options.copy_restore"):
        case_from(strategy={"name": "dlrover_flash", "options": {"copy_restore": True}}, workload=PACED)


def _leftovers(work_dir: Path, nodes: int) -> list[str]:
    """What the case's node agents left under their prefixes, and agents still running."""
    names = [agent_name(agent_dir(work_dir / "node_agents", node)) for node in range(nodes)]
    left = [p.name for name in names for p in SHARED_MEMORY.glob(f"{name}*")]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:  # a process may end between the listing and the reads
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            ours = str(work_dir).encode() in Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"resilience.strategies.dlrover.agent" in command and ours:
            left.append(f"agent pid {pid}")
    return left


@pytest.mark.slow
def test_a_killed_rank_restores_from_the_memory_its_agent_kept(tmp_path, dlrover_layered):
    result = run_case(tmp_path, keep=True, strategy=FLASH, workload=PACED,
                      fault={"kind": "kill", "rank": 1, "step": 7, "phase": "train"})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 6
    # step 6 was never persisted: only the node's shared memory held it at the restart
    checkpoints = result.work_dir / "checkpoints"
    restart_log = (result.work_dir / RESTART / "rank0.err").read_text()
    assert "Load checkpoint at step 6 from memory" in restart_log
    assert not (checkpoints / "6").exists() and (checkpoints / "4" / "rank_0.pt").exists()
    assert result.restored_from == "memory" and result.storage_bytes_read == 0
    assert {e["versions"]["dlrover"] for e in result.phase(RESTART).events(Event.JOINED)} == {"0.6.1"}
    assert _leftovers(result.work_dir, 1) == []


@pytest.mark.slow
def test_a_lost_node_takes_its_memory_and_the_restart_restores_from_storage(tmp_path, dlrover_layered):
    result = run_case(tmp_path, keep=True, strategy=FLASH, workload=PACED,
                      fault={"kind": "node_loss", "rank": 1, "step": 7, "phase": "train"},
                      expect={"outcome": "recovers", "fallback_ok": True})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 4
    restart_log = (result.work_dir / RESTART / "rank0.err").read_text()
    assert "checkpoints/4/rank_0.pt" in restart_log and "from memory" not in restart_log
    saved = (result.work_dir / "checkpoints" / "4" / "rank_0.pt").stat().st_size
    assert result.restored_from == "storage" and result.storage_bytes_read >= 2 * saved  # both ranks read it
    assert _leftovers(result.work_dir, 1) == []


@pytest.mark.slow
def test_the_memory_restore_as_dlrover_returns_it_diverges(tmp_path, dlrover_layered):
    """The views of the one shared segment, kept by every local rank's optimizer (findings)."""
    result = run_case(tmp_path, strategy={"name": "dlrover_flash"}, workload=PACED,
                      fault={"kind": "kill", "rank": 1, "step": 7, "phase": "train"})
    assert result.verdict.kind is VerdictKind.SILENT, result.verdict.findings
    assert result.verdict.restored_step == 6


def test_a_fault_in_the_node_agent_is_refused_where_the_strategy_keeps_none():
    with pytest.raises(ScenarioError) as info:
        case_from(strategy="torch.rank0", workload=PACED,
                  fault={"kind": "kill", "process": "agent", "rank": 0, "step": 4, "phase": "save", "point": "open"})
    assert "fault.process" in str(info.value) and "dlrover_flash" in str(info.value), str(info.value)


def test_an_agent_killed_as_it_opens_the_tracker_leaves_it_empty_and_the_relaunch_starts_over(tmp_path,
                                                                                             dlrover_layered):
    result = run_case(tmp_path, keep=True, strategy=FLASH, workload=PACED,
                      fault={"kind": "kill", "process": "agent", "rank": 0, "step": 8, "phase": "save",
                             "point": "open", "file": "dlrover_latest.txt"})
    fired = result.phase("first_run").fault_events
    assert [(e["process"], e["file"], e["offset"]) for e in fired] == [("agent", "dlrover_latest.txt", 0)]
    assert fired[0]["pid"] not in {e["pid"] for e in result.phase("first_run").events(Event.JOINED)}
    assert result.phase("first_run").status == "completed"  # the ranks never knew
    assert result.verdict.kind is VerdictKind.SILENT and result.verdict.restored_step == 0
    assert result.restored_from == "nothing" and _leftovers(result.work_dir, 1) == []


@pytest.mark.slow
@pytest.mark.parametrize("restart, tier, verdict", [
    ({}, "memory", VerdictKind.RECOVERED),
    ({"world_size": 4, "topology": {"nodes": 2}}, "storage", VerdictKind.SILENT),
])
def test_damage_at_rest_waits_for_the_agents_persist_and_hides_behind_the_memory(tmp_path, dlrover_layered,
                                                                                 restart, tier, verdict):
    result = run_case(tmp_path, strategy=FLASH, workload=PACED, restart=restart,
                      fault={"kind": "bit_flip", "rank": 0, "step": 4, "file": "4/rank_0.pt"})
    fired = [e for p in result.phases for e in p.fault_events if e["event"] == Event.FAULT_FIRED]
    assert [e["files"] for e in fired] == [["4/rank_0.pt"]]  # the agent's file, once it was on disk
    assert result.verdict.kind is verdict and result.verdict.restored_step == 4, result.verdict.findings
    assert result.restored_from == tier
    assert (result.storage_bytes_read == 0) is (tier == "memory")


@pytest.mark.slow
@pytest.mark.minutes(2)
def test_a_power_cut_in_the_agents_persist_is_explored_whole_with_fresh_agents(tmp_path, dlrover_layered):
    """Node 0's agent traces its persists (stream 2, after the two ranks'); every crash state is
    restored by fresh ranks beside fresh agents (the cut took the memory). DLRover fsyncs the tracker
    but not the shard (ckpt_saver.py:1049, storage.py:143-147): the tracker can name a step whose
    shard never fully reached the disk."""
    result = run_case(tmp_path, keep=True, strategy=FLASH, workload=PACED, fault={"kind": "power_loss", "step": 8})
    report = json.loads((result.work_dir / "exploration.json").read_text())
    assert report["enumerated"] and not report["too_large"] and "node agents" in report["restored_in"]
    assert (trace_dir(result.work_dir) / "trace_rank2.jsonl").exists()
    by_cut = {}
    for state in report["states"]:
        by_cut.setdefault(tuple(state["point"]["cuts"]), []).append(state)
    complete = max(by_cut)  # every op of every stream happened
    # the agent cut before its persist began: step 6 was in memory only, so step 4 restores and that is no loss
    assert all(s["verdict"] == "RECOVERED" for cuts, states in by_cut.items() if cuts[2] == 0 for s in states)
    assert any(s["verdict"] == "RECOVERED" and not s["point"]["losses"] and not s["point"]["lost_metadata"]
               for s in by_cut[complete])
    assert result.verdict.kind is VerdictKind.SILENT
    described = "\n".join(report["reported"]["description"])
    assert "node 0's agent lost power" in described, described
    assert _leftovers(result.work_dir, 1) == []  # the first run's agents, and any agent process of the case
    restore_agents = [root / "node_agents" for root in (result.work_dir / "restores").glob("*-agents")]
    assert restore_agents and not [path for root in restore_agents
                                   for path in SHARED_MEMORY.glob(f"{agent_name(agent_dir(root, 0))}*")]
