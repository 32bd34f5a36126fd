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
from resilience.faults.network import netns
from resilience.launch import nodes as nodes_module
from resilience.launch.nodes import Nodes
from resilience.oracle.outcome import judge_case
from resilience.report.text import verdict_line
from resilience.run.harness import Harness
from resilience.run.nodes_job import FAST_RDZV, run_job_on_nodes
from tests.procs import pids_naming

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "node_loss.scenario.yaml"
TORN = "fault.after_bytes=4096"  # node 1 lost 4096 bytes into rank 2's step-8 file; restart on nodes 0 and 2
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


def run(case_id: str | None, tmp_path: Path, scenario: Path = SCENARIO, **options):
    job = run_job_on_nodes(scenario, case_id, nodes=2, nproc_per_node=2, work_dir=tmp_path, share_store=False,
                           deadline_s=DEADLINE_S, **options)
    assert_nothing_left(job)
    assert not job.timed_out, [node.output[-2000:] for node in job.nodes]
    return job


@pytest.mark.slow
@needs_nodes
def test_a_lost_node_is_replaced_by_a_spare_and_every_driver_prints_the_local_harness_verdict(tmp_path):
    job = run(TORN, tmp_path / "nodes", spares=1)
    lost, survivors = [n for n in job.nodes if n.lost], job.survivors()
    assert [n.index for n in lost] == [1] and [n.index for n in survivors] == [0, 2], [n.output for n in job.nodes]
    # every driver that lived judged the same files: the same line, the local harness's for the same case
    local = Harness(work_root=tmp_path / "local").run(case_named(TORN))
    expected = f"{judge_case(local).status.upper():<6} {verdict_line(local)}"
    assert local.verdict.kind is VerdictKind.LOUD, local.verdict.findings
    local_first_run = local.phases[1]  # the local harness lost node 1 at once too: ranks 2 and 3
    assert [r.returncode for r in local_first_run.ranks][2:] == [-9, -9]
    assert "node 1 lost: ranks [2, 3] SIGKILLed at once" in "\n".join(local.verdict.findings)
    assert [n.verdict_line for n in survivors] == [expected, expected], [n.output for n in survivors]
    # availability inside LOUD, proven as the local harness proves it (step 4 intact): each driver
    # restored step 4 with load_step in fresh local ranks of its own, from the shared storage
    assert local.verdict.intact_step == 4
    for address in ("10.213.0.1", "10.213.0.3"):
        probe = phase_events(job.case_dir, f"driver.{address}", "fallback_step_4")
        assert sorted(probe) == [0, 1, 2, 3] and all(
            [e["step"] for e in rank if e["event"] in ("restored", "done")] == [4, 8] for rank in probe.values())

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


SHRINK = """\
    name: node 1 lost, the job goes on at half the size
    description: torch.rank0, node 1 (ranks 2 and 3) lost in the step-6 all-reduce; restart at world size 2
    strategy: torch.rank0
    workload: {model: mlp, world_size: 4, steps: 8, checkpoint_every: 4, seed: 0}
    topology: {nodes: 2}
    fault: {kind: node_loss, rank: 2, step: 6, phase: train}
    restart: {world_size: 2}
    timeouts: {collective: 20, phase: 90}
    expect: recovers
    """


def scenario_file(directory: Path, text: str) -> Path:
    path = directory / "case.scenario.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.slow
@needs_nodes
def test_the_survivor_goes_on_alone_elastically_and_the_restore_matches_the_continuation(tmp_path):
    job = run(None, tmp_path / "job", scenario_file(tmp_path, SHRINK), min_nodes=1)
    assert [n.index for n in job.survivors()] == [0], [n.output for n in job.nodes]
    line = job.survivors()[0].verdict_line
    assert line.startswith("PASSED RECOVERED") and "restored step 4" in line, job.survivors()[0].output
    begins = phase_events(job.case_dir, "launch0.restart1", "restart")
    assert sorted(begins) == [0, 1] and {b[0]["node"] for b in begins.values()} == {"0"}
    # judged against the oracle's continuation at world size 2, from the job's own reference snapshot
    continuation = phase_events(job.case_dir, "driver.10.213.0.1", "continuation")  # node 0's driver
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


@pytest.mark.slow
@needs_nodes
def test_losing_the_node_that_hosts_the_store_ends_the_whole_job_loudly(tmp_path):
    """pytorch #67742: the c10d rendezvous store lives in node 0's agent; without it the survivor's
    agent cannot re-rendezvous, even with --nnodes 1:2 (the local harness restarts this case)."""
    job = run_job_on_nodes(scenario_file(tmp_path, STORE_HOST), None, nodes=2, nproc_per_node=2,
                           work_dir=tmp_path / "job", min_nodes=1,
                           share_store=False, deadline_s=DEADLINE_S,
                           rdzv_conf=FAST_RDZV + ",read_timeout=5")  # each attempt to reach the store: 5 s, not 60
    assert_nothing_left(job)
    assert [n.index for n in job.survivors()] == [1]
    line = job.survivors()[0].verdict_line
    assert line.startswith("FAILED LOUD") and "expected RECOVERED" in line, job.survivors()[0].output
    assert "RendezvousConnectionError" in job.survivors()[0].output
    assert not list(job.case_dir.glob("launch*.restart1"))  # no restart ever began


@pytest.mark.slow
@needs_nodes
def test_a_harness_killed_mid_job_leaves_no_namespace_agent_rank_or_disk(tmp_path):
    """The janitor kills what is still in each node's namespace (workers lead their own sessions)."""
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from resilience.run.nodes_job import FAST_RDZV, run_job_on_nodes
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
        alive = [pid for pid in pids_naming(work) if pid != os.getpid()]
        if not left and not alive and not (work / "case" / "checkpoints").exists():
            return
        time.sleep(0.2)
    pytest.fail(f"left behind: namespaces {left}, processes {alive}")


@needs_nodes
def test_a_node_is_killed_whole_through_its_namespace(tmp_path):
    """Processes in sessions of their own (as torch elastic starts its workers) die with the node."""
    with Nodes(2, tmp_path / "disks") as machine:
        log = tmp_path / "node1.log"
        spawner = ("import subprocess, time\n"
                   "children = [subprocess.Popen(['sleep', '300'], start_new_session=True) for _ in range(2)]\n"
                   "time.sleep(300)\n")
        machine.start(1, [sys.executable, "-c", spawner], dict(os.environ), log)
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


# -- without root: the pieces ------------------------------------------------------------------------

def test_ranks_agree_on_their_incarnation_whatever_their_agents_restart_counts_say(tmp_path):
    """Rounds of 4, then 4 (a spare replaced a node), then 2 (elastic shrink): each process takes a
    ticket as it starts; the rounds are recorded once, by whichever process came first."""
    from concurrent.futures import ThreadPoolExecutor

    from resilience.core.elastic_layout import Incarnation, claim_incarnation

    seen = []
    for size in (4, 4, 2):
        with ThreadPoolExecutor(size) as pool:
            seen.append(set(pool.map(lambda _, size=size: claim_incarnation(tmp_path, 0, size), range(size))))
    assert seen == [{Incarnation(0, 0)}, {Incarnation(0, 1)}, {Incarnation(0, 2)}]
    assert claim_incarnation(tmp_path, 1, 4) == Incarnation(1, 0)  # each launch counts afresh
    assert sorted(p.name for p in (tmp_path / "launch0.rounds").iterdir()) == ["0", "1", "2"]


def test_a_round_that_closed_before_every_node_of_the_first_run_joined_is_not_counted(tmp_path):
    """--nnodes 1:2 under load: node 0's agent alone forms a group of 2, node 1's agent arrives
    later and the agents start again at 4. The group of 2 is early; the group of 4 is the first
    run, and a later group of 2 (a shrink) is a restart."""
    from resilience.core.elastic_layout import EARLY, Incarnation, TorchrunLayout, claim_incarnation

    claimed = [[claim_incarnation(tmp_path, 0, size, first_size=4) for _ in range(size)] for size in (2, 4, 2)]
    assert [set(group) for group in claimed] == [{Incarnation(0, EARLY)}, {Incarnation(0, 0)}, {Incarnation(0, 1)}]
    layout = TorchrunLayout(tmp_path)
    assert [layout.round_size(Incarnation(0, i)) for i in (0, 1)] == [4, 2]


def test_the_per_node_command_is_the_documented_one(tmp_path):
    from resilience.launch.torchrun_command import TorchrunOptions, torchrun_command
    from resilience.run.nodes_job import driver_command

    from .harness_helpers import case_from

    case = case_from(workload={"world_size": 4, "global_batch": 8})
    argv = torchrun_command(case, TorchrunOptions(nnodes=2, min_nodes=1, rdzv_endpoint="10.213.0.1:29400",
                                                  rdzv_conf="is_host=1", local_addr="10.213.0.1"), tmp_path)
    assert argv[argv.index("--nnodes") + 1] == "1:2" and argv[argv.index("--rdzv-conf") + 1] == "is_host=1"
    assert argv[argv.index("--local-addr") + 1] == "10.213.0.1"

    command = driver_command(Path("x.scenario.yaml"), "id", Nodes(2, tmp_path / "disks"), 1, nnodes=2, nproc_per_node=2,
                             case_dir=tmp_path, min_nodes=1, join=True)
    text = " ".join(command)
    for words in ("torchrun x.scenario.yaml --case id --nnodes 1:2 --nproc-per-node 2",
                  "--rdzv-endpoint 10.213.0.1:29400", "--local-addr 10.213.0.2", "--rdzv-conf is_host=0,",
                  f"--case-dir {tmp_path}", "--join"):
        assert words in text, text
    docs = (REPO / "docs" / "torchrun.md").read_text()
    assert "--rdzv-endpoint 10.213.0.1:29400 --rdzv-id job --local-addr 10.213.0.1" in docs


def test_node_loss_under_torchrun_needs_several_nodes_and_lost_storage_needs_node_local_disks(tmp_path):
    from resilience.errors import ScenarioError
    from resilience.faults.base import CaseEnvironment
    from resilience.faults.process.node_loss import NodeLoss
    from resilience.launch.torchrun_command import TorchrunOptions, incompatibility

    from .harness_helpers import case_from

    case = case_from(fault={"kind": "node_loss", "rank": 1, "step": 6, "phase": "train"})
    assert "needs several nodes" in incompatibility(case, TorchrunOptions())
    assert incompatibility(case, TorchrunOptions(nnodes=2, rdzv_endpoint="10.213.0.1:29400")) is None
    lost = case_from(fault={"kind": "node_loss", "rank": 1, "step": 6, "phase": "train", "local_storage": "lost"})
    with pytest.raises(ScenarioError, match="fault.local_storage: is 'lost' but topology.storage is 'shared'.*"
                                            "got 'lost'; allowed: kept"):
        NodeLoss(lost.fault).setup(CaseEnvironment(case=lost, case_dir=tmp_path, checkpoint_dir=tmp_path))

