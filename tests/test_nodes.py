"""Several nodes for real (root): each node a network namespace with its own address, its own
torchrun elastic agent started with the documented per-node command, the c10d rendezvous, the
store and gloo across the bridge; a whole node lost (node_loss), replaced by a spare or not
(--nnodes MIN:MAX); nothing left behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from resilience.commands.case_loop import load_or_report
from resilience.core.case import VerdictKind
from resilience.faults import netns
from resilience.launch import nodes as nodes_module
from resilience.launch.nodes import Nodes
from resilience.oracle.outcome import judge_case
from resilience.report.text import verdict_line
from resilience.run.harness import Harness
from resilience.run.nodes_job import run_job_on_nodes

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "node_loss.scenario.yaml"
TORN = "fault.after_bytes=4096"  # node 1 lost 4096 bytes into rank 2's step-8 file; restart on nodes 0 and 2
SHRINK = ("strategy=torch.rank0,fault.kind=node_loss,fault.rank=2,fault.step=6,fault.phase=train,"
          "restart.world_size=2")
DEADLINE_S = 240

needs_nodes = pytest.mark.skipif(nodes_module.unavailable_reason() is not None,
                                 reason=str(nodes_module.unavailable_reason()))


def case_named(case_id: str):
    cases, errors = load_or_report([str(SCENARIO)], lambda case: case.id == case_id)
    assert not errors and len(cases) == 1, (errors, case_id)
    return cases[0]


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def phase_events(case_dir: Path, incarnation: str, phase: str) -> dict[int, list[dict]]:
    directory = case_dir / incarnation / phase
    return {int(path.name[4:].split(".")[0]): events(path) for path in sorted(directory.glob("rank*.events.jsonl"))}


def assert_nothing_left(job) -> None:
    """No namespace of this process, no process naming the case directory, no node-local disk."""
    assert not [name for name in netns.list_namespaces() if name.startswith(f"resilience-{os.getpid()}-")]
    marker = str(job.case_dir)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            assert marker not in cmdline, f"process {entry.name} outlived the job: {cmdline!r}"
    assert not (job.case_dir / "checkpoints").exists(), "the nodes' local disks were left behind"


def run(case_id: str, tmp_path: Path, **options):
    job = run_job_on_nodes(SCENARIO, case_id, nodes=2, nproc_per_node=2, work_dir=tmp_path, share_store=False,
                           deadline_s=DEADLINE_S, **options)
    assert_nothing_left(job)
    assert not job.timed_out, [node.output[-2000:] for node in job.nodes]
    return job


@needs_nodes
def test_a_lost_node_is_replaced_by_a_spare_and_every_driver_prints_the_local_harness_verdict(tmp_path):
    job = run(TORN, tmp_path / "nodes", spares=1)
    lost, survivors = [n for n in job.nodes if n.lost], job.survivors()
    assert [n.index for n in lost] == [1] and [n.index for n in survivors] == [0, 2], [n.output for n in job.nodes]
    # every driver that lived judged the same files: the same line, the local harness's for the same case
    local = Harness(work_root=tmp_path / "local").run(case_named(TORN))
    expected = f"{judge_case(local).status.upper():<6} {verdict_line(local)}"
    assert local.verdict.kind is VerdictKind.LOUD, local.verdict.findings
    assert [n.verdict_line for n in survivors] == [expected, expected], [n.output for n in survivors]

    first_run = phase_events(job.case_dir, "launch0.restart0", "first_run")
    fired = [e for rank_events in first_run.values() for e in rank_events if e["event"] == "fault_fired"]
    assert [(e["rank"], e["kind"], e["offset"]) for e in fired] == [(2, "node_loss", 4096)]
    # the whole node at once: its ranks and their supervisors never wrote how they ended
    assert not (job.case_dir / "launch0.restart0" / "outcome.rank2.json").exists()
    assert not (job.case_dir / "launch0.restart0" / "outcome.rank3.json").exists()
    # the restart ran on node 0 and the spare (node 2, placed after node 0 by its address), in
    # the agents' restart of the same launch, across the namespaces
    begins = {rank: e[0] for rank, e in phase_events(job.case_dir, "launch0.restart1", "restart").items()}
    assert {rank: (b["node"], b["group_rank"]) for rank, b in begins.items()} == {
        0: ("0", 0), 1: ("0", 0), 2: ("2", 1), 3: ("2", 1)}
    # the agents' own restart counts disagree: the spare's agent never restarted anything
    assert {rank: b["agent_restart_count"] for rank, b in begins.items()} == {0: 1, 1: 1, 2: 0, 3: 0}


@needs_nodes
def test_the_survivor_goes_on_alone_elastically_and_the_restore_matches_the_continuation(tmp_path):
    job = run(SHRINK, tmp_path, min_nodes=1)
    assert [n.index for n in job.survivors()] == [0], [n.output for n in job.nodes]
    line = job.survivors()[0].verdict_line
    assert line.startswith("PASSED RECOVERED") and "restored step 4" in line, job.survivors()[0].output
    begins = phase_events(job.case_dir, "launch0.restart1", "restart")
    assert sorted(begins) == [0, 1] and {b[0]["node"] for b in begins.values()} == {"0"}
    # judged against the oracle's continuation at world size 2, from the job's own reference snapshot
    continuation = phase_events(job.case_dir, ".", "continuation")
    assert sorted(continuation) == [0, 1]
    fired = min(e["time"] for r in phase_events(job.case_dir, "launch0.restart0", "first_run").values()
                for e in r if e["event"] == "fault_fired")
    print(f"scale-down: node lost -> restart phase begun in {min(b[0]['time'] for b in begins.values()) - fired:.1f} s")


STORE_HOST = """\
    name: the node hosting the rendezvous store lost
    description: node 0 (ranks 0 and 1, and the c10d store) lost whole in the step-6 all-reduce
    strategy: torch.rank0
    workload: {model: mlp, world_size: 4, steps: 8, checkpoint_every: 4, seed: 0}
    topology: {nodes: 2}
    fault: {kind: node_loss, rank: 0, step: 6, phase: train}
    restart: {world_size: 2}
    timeouts: {collective: 20, phase: 90}
    expect: recovers
    """


@needs_nodes
def test_losing_the_node_that_hosts_the_store_ends_the_whole_job_loudly(tmp_path):
    """pytorch #67742: the c10d rendezvous store lives in node 0's agent; without it the survivor's
    agent cannot re-rendezvous, even with --nnodes 1:2 (the local harness restarts this case)."""
    scenario = tmp_path / "store_host.scenario.yaml"
    scenario.write_text(textwrap.dedent(STORE_HOST))
    job = run_job_on_nodes(scenario, None, nodes=2, nproc_per_node=2, work_dir=tmp_path / "job", min_nodes=1,
                           share_store=False, deadline_s=DEADLINE_S)
    assert_nothing_left(job)
    assert [n.index for n in job.survivors()] == [1]
    line = job.survivors()[0].verdict_line
    assert line.startswith("FAILED LOUD") and "expected RECOVERED" in line, job.survivors()[0].output
    assert "RendezvousConnectionError" in job.survivors()[0].output
    assert not list(job.case_dir.glob("launch*.restart1"))  # no restart ever began


@needs_nodes
def test_a_harness_killed_mid_job_leaves_no_namespace_agent_rank_or_disk(tmp_path):
    """The janitor kills what is still in each node's namespace (workers lead their own sessions)."""
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from resilience.run.nodes_job import run_job_on_nodes
        run_job_on_nodes(Path({str(SCENARIO)!r}), {TORN!r}, nodes=2, nproc_per_node=2, work_dir=Path(sys.argv[1]))
        """)
    work = tmp_path / "job"
    work.mkdir()
    harness = subprocess.Popen([sys.executable, "-c", script, str(work)], cwd=REPO, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list((work / "case").glob("launch0.restart0/reference/rank3.events.jsonl")):
            assert time.monotonic() < deadline and harness.poll() is None, "the job never started its ranks"
            time.sleep(0.2)
        namespaces = [name for name in netns.list_namespaces() if name.startswith(f"resilience-{harness.pid}-")]
        assert len(namespaces) == 3  # the switch and two nodes
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait(timeout=30)
    finally:
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [name for name in netns.list_namespaces() if name in namespaces]
        alive = [pid for pid in _pids_naming(work) if pid != os.getpid()]
        if not left and not alive and not (work / "case" / "checkpoints").exists():
            return
        time.sleep(0.2)
    pytest.fail(f"left behind: namespaces {left}, processes {alive}")


def _pids_naming(marker: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(marker) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@needs_nodes
def test_a_node_is_killed_whole_through_its_namespace(tmp_path):
    """Processes in sessions of their own (as torch elastic starts its workers) die with the node."""
    with Nodes(2, tmp_path / "disks") as machine:
        log = tmp_path / "node1.log"
        machine.start(1, ["sh", "-c", "setsid sleep 300 & setsid sleep 300 & sleep 300"], dict(os.environ), log)
        deadline = time.monotonic() + 10
        while len(machine.pids(1)) < 3:
            assert time.monotonic() < deadline, machine.pids(1)
            time.sleep(0.05)
        assert machine.pids(0) == []
        sessions = {os.getsid(pid) for pid in machine.pids(1)}
        assert len(sessions) == 3
        killed = machine.kill(1)
        assert len(killed) == 3 and machine.pids(1) == []
        assert (tmp_path / "disks" / "node1").is_dir()
    assert not (tmp_path / "disks").exists()
    assert not [name for name in netns.list_namespaces() if name.startswith(f"resilience-{os.getpid()}-")]
