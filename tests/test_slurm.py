"""Real SLURM on one machine (root, Debian's slurmctld/slurmd/munge): the docs' recipe submitted
through sbatch to a cluster whose nodes are network namespaces, and what stays behind afterwards."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resilience.core.case import VerdictKind
from resilience.core.events import read_events
from resilience.errors import SlurmError
from resilience.faults.network import netns
from resilience.launch.slurm_cluster import LocalCluster, slurm_missing
from resilience.run.harness import Harness
from resilience.scenario.loader import load_file
from tests.procs import pids_naming

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "torchrun.md"
JOB_TIMEOUT_S = 300

needs_slurm = pytest.mark.skipif(slurm_missing() is not None, reason=str(slurm_missing()))


def docs_recipe() -> str:
    """The one bash block of docs/torchrun.md that is a batch script."""
    blocks = re.findall(r"```bash\n(.*?)```", DOCS.read_text(), re.S)
    recipes = [block for block in blocks if block.startswith("#!/bin/bash\n#SBATCH")]
    assert len(recipes) == 1, f"{DOCS}: expected one SLURM recipe (a bash block starting #!/bin/bash, #SBATCH)"
    return recipes[0]


def job_environment(cluster: LocalCluster) -> dict[str, str]:
    """What a user's shell has: this interpreter's environment first on PATH (``python`` in the recipe)."""
    env = cluster.environment()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture
def cluster(tmp_path):
    root = tmp_path / "slurm"
    cluster = LocalCluster(root, nodes=3)
    prefix = cluster.machines.wiring.prefix
    try:
        yield cluster.start()
    finally:
        cluster.stop()  # raises naming any namespace the kernel kept
        assert not [name for name in netns.list_namespaces() if name.startswith(prefix)]
        assert pids_naming(tmp_path) == [], "a daemon, step or rank outlived the cluster"


def submit(cluster: LocalCluster, tmp_path: Path, script_text: str) -> tuple[str, Path]:
    cases = tmp_path / "cases"  # the directory the job is submitted from: its case directories go here
    cases.mkdir()
    script = cases / "resilience.sbatch"
    script.write_text(script_text)
    job_id = cluster.submit(script, chdir=REPO, output=cases / "slurm-%j.out", env=job_environment(cluster))
    return job_id, cases


@pytest.mark.slow
@needs_slurm
def test_the_docs_slurm_recipe_runs_through_sbatch_on_two_namespaced_nodes(cluster, tmp_path):
    before = cluster.machines.wiring.counters()
    job_id, cases = submit(cluster, tmp_path, docs_recipe())
    job = cluster.wait(job_id, JOB_TIMEOUT_S)
    output = (cases / f"slurm-{job_id}.out").read_text()
    assert job.state == "COMPLETED" and job.nodes == "node[0-1]", (job, output)
    # each node's driver judged the same files and printed the same verdict
    verdicts = re.findall(r"^(PASSED RECOVERED expected RECOVERED scenarios/no_fault.scenario.yaml"
                          r"\[strategy=torch.rank0\] \(restored step 12, .*)$", output, re.M)
    assert len(verdicts) == 2 and verdicts[0] == verdicts[1], output
    case_dir = cases / f"case-{job_id}"
    assert (case_dir / "checkpoints").is_dir()
    # the rendezvous and gloo crossed the namespaces: both nodes' veths carried the all-reduces
    after = cluster.machines.wiring.counters()
    for node in cluster.nodes[:2]:
        sent = after[node.namespace]["tx_bytes"] - before[node.namespace]["tx_bytes"]
        assert sent > 300_000, f"{node.name} sent only {sent} bytes"
    assert after[cluster.nodes[2].namespace]["tx_bytes"] - before[cluster.nodes[2].namespace]["tx_bytes"] < 100_000


NODE_LOSS = """name: node 1 lost at step 6
description: one rank per node; the node of rank 1 is lost whole as it begins step 6 (after the step-4 save)
strategy: torch.rank0
workload: {model: mlp, world_size: 2, steps: 12, checkpoint_every: 4, seed: 0}
topology: {nodes: 2}
fault: {kind: node_loss, rank: 1, step: 6, phase: train}
restart: {topology: {nodes: 2, node_ids: [0, 2]}}
expect: recovers
"""


def await_fault(case_dir: Path, rank: int, timeout_s: float) -> dict:
    """The first run's fault event of ``rank`` once written (the rank dies right after it)."""
    events = case_dir / "launch0.restart0" / "first_run" / f"rank{rank}.events.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fired = [e for e in read_events(events) if e["event"] == "fault_fired"]
        if fired:
            return fired[0]
        time.sleep(0.02)
    raise AssertionError(f"rank {rank} never reached its fault within {timeout_s:g} s: {events}")


@pytest.mark.slow
@needs_slurm
def test_a_node_lost_under_slurm_is_requeued_on_a_spare_node_and_gives_the_local_harness_verdict(cluster, tmp_path):
    scenario = tmp_path / "node_loss.scenario.yaml"
    scenario.write_text(NODE_LOSS)
    documented = "scenarios/no_fault.scenario.yaml --case strategy=torch.rank0"
    assert documented in docs_recipe()
    recipe = docs_recipe().replace(documented, str(scenario))  # the docs' recipe, another case
    job_id, cases = submit(cluster, tmp_path, recipe)
    case_dir = cases / f"case-{job_id}"
    await_fault(case_dir, 1, JOB_TIMEOUT_S)
    # the fault ended its node from inside: slurmd, slurmstepd, the driver, the agent and the rank
    node1 = cluster.node("node1")
    deadline = time.monotonic() + 30
    while cluster.node_processes(node1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cluster.node_processes(node1) == [], "node_loss left processes on node1"
    # marked down as a health check does (SLURM's own ping found the silent slurmd ~26 s later here)
    cluster.scontrol("update", "nodename=node1", "state=down", "reason=node lost")
    requeued = cluster.wait(job_id, 30, until=lambda job: job.restarts == 1)
    job = cluster.wait(job_id, JOB_TIMEOUT_S)
    output = (cases / f"slurm-{job_id}.out").read_text()
    assert job.state == "COMPLETED" and job.restarts == 1 and job.nodes == "node[0,2]", (job, output)
    verdicts = re.findall(r"^\S+ (\S+) expected RECOVERED \S+node_loss.scenario.yaml\S* \(restored step (\d+),",
                          output, re.M)
    assert len(verdicts) == 2 and verdicts[0] == verdicts[1], (output, requeued)  # node0's and node2's driver
    # the same case under the local harness: node 1's ranks SIGKILLed as rank 1 begins step 6
    local = Harness(work_root=tmp_path / "local").run(load_file(scenario).cases[0])
    assert local.verdict.kind is VerdictKind.RECOVERED and local.verdict.restored_step == 4, local.verdict.findings
    assert verdicts[0] == (local.verdict.kind.name, str(local.verdict.restored_step)), (verdicts, output)


def test_the_cluster_configuration_names_each_node_with_its_own_port_and_paths(tmp_path):
    """What slurm.conf says (no daemon started: runs without root too)."""
    cluster = LocalCluster(tmp_path / "slurm", nodes=2)
    conf = cluster.slurm_conf()
    assert "NodeName=node0 NodeAddr=10.213.0.1 Port=6818 " in conf
    assert "NodeName=node1 NodeAddr=10.213.0.2 Port=6819 " in conf
    assert "SlurmctldHost=ctl(10.213.0.3)" in conf
    for key in ("SlurmdPidFile", "SlurmdLogFile"):
        line = next(line for line in conf.splitlines() if line.startswith(key + "="))
        assert line.startswith(f"{key}={tmp_path / 'slurm'}") and "%n" in line, line
    # sockets (munged's, slurmstepd's in the spool) must fit a Unix socket path of 108 bytes
    spool = next(line for line in conf.splitlines() if line.startswith("SlurmdSpoolDir="))
    assert spool == f"SlurmdSpoolDir={cluster.sockets}/%n" and len(str(cluster.sockets)) < 40
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    assert f"AuthInfo=socket={cluster.sockets / 'munge.socket'}," in conf
    with pytest.raises(SlurmError, match="at least one node; got nodes=0"):
        LocalCluster(tmp_path, nodes=0)


HOLDS_A_CLUSTER = """
import sys, time
from pathlib import Path
from resilience.launch.slurm_cluster import LocalCluster
cluster = LocalCluster(Path(sys.argv[1]), nodes=2).start()
print(cluster.machines.wiring.prefix, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@needs_slurm
def test_a_process_killed_with_its_cluster_running_leaves_no_daemon_and_no_namespace(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_A_CLUSTER, str(tmp_path / "slurm")],
                              stdout=subprocess.PIPE, text=True)
    prefix = holder.stdout.readline().strip()  # the cluster is up (start has its own deadline)
    try:
        assert prefix and len(pids_naming(tmp_path)) >= 4, "munged, slurmctld and two slurmd"
    finally:
        holder.kill()  # no finally block of its own runs: the janitor frees what it registered
        holder.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (pids_naming(tmp_path) or [
            name for name in netns.list_namespaces() if name.startswith(prefix + "-")]):
        time.sleep(0.1)
    assert pids_naming(tmp_path) == [], "a daemon outlived the process that started it"
    assert not [name for name in netns.list_namespaces() if name.startswith(prefix + "-")]
