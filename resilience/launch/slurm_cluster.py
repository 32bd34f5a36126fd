"""SLURM on one machine (root): munged, slurmctld and one ``slurmd -N node<k>`` per node, each node
a network namespace of its own, everything under one directory.

    with LocalCluster(root, nodes=3) as cluster:      # root: an empty directory the caller removes
        job = cluster.submit(script, chdir=checkout, output=root / "slurm-%j.out")
        record = cluster.wait(job, timeout_s=300)      # -> SlurmJob (state COMPLETED, NODE_FAIL, ...)

A node is one of `launch.nodes.Nodes` (a network namespace with ``veth0`` on the partition fault's
bridge, 10.213.0.<k+1>), plus a mount and UTS namespace of its own in which ``/etc/hosts`` is
ROOT/hosts (bind-mounted: it names every node) and ``gethostname()`` is ``node<k>``. SLURM, torchrun's
c10d rendezvous (it decides which agent hosts the store by comparing the endpoint with the host name)
and gloo (it binds the address the host name resolves to) then see what they see on separate
machines, and nothing in them is changed. The controller and munged live in one more namespace
(``ctl``, the last address); commands to the cluster (``sbatch``, ``scontrol``) run there through
``nsenter``, with ``SLURM_CONF`` naming ROOT/slurm.conf. munged has its own key and socket
(``AuthInfo=socket=``). A job's steps run in the namespaces of the nodes they were given.

Nothing stays behind: every daemon leads a process group registered with the janitor, every
namespace is registered (the janitor kills what runs in it before deleting it), and `stop` SIGKILLs
every process in every namespace of the cluster (slurmstepd and a job's tasks leave the daemons'
process groups), then deletes the namespaces (`Nodes.destroy`). The state and logs are under ROOT,
the sockets and spools in a short directory of /tmp of their own. The pid space stays the
machine's: a node_loss fault in a rank finds every process of its node (slurmd and slurmstepd
included) by network namespace, as ``RESILIENCE_NODE_NAMESPACE`` names it; a TaskProlog puts that
and ``RESILIENCE_NODE`` into every task's environment.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..core import janitor
from ..core.elastic_layout import NODE_ENV, NODE_NAMESPACE_ENV
from ..core.waiting import wait_until
from ..errors import SlurmError
from ..faults.network.netns import NETNS_DIR
from .nodes import Nodes

BINARIES = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "scontrol", "srun", "unshare", "nsenter", "ip")
INSTALL = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
CONTROLLER = "ctl"
CONTROLLER_PORT = 6817
FIRST_SLURMD_PORT = 6818  # node k listens on FIRST_SLURMD_PORT + k (distinct, as on one shared address)
COMMAND_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
CRED_EXPIRE_S = 10  # a requeued job may start again this long after it was requeued (default 120)
SLURMD_TIMEOUT_S = 10  # a node silent this long is DOWN (measured: detected ~26 s after its loss)
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED")
# In the node's private mount and UTS namespace: the cluster's hosts file over /etc/hosts, the node's
# host name, then the daemon ($1 hosts file, $2 host name, the rest its argv).
_ENTER = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
_NODE_NAMESPACES = ["unshare", "--mount", "--uts", "--propagation", "private"]


def slurm_missing() -> str | None:
    """Why this machine cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "a SLURM cluster in network namespaces needs root"
    missing = [name for name in BINARIES if shutil.which(name) is None]
    return f"missing {', '.join(missing)}: {INSTALL} (as root)" if missing else None


@dataclass(frozen=True)
class SlurmNode:
    name: str  # SLURM's NodeName and the host name inside the node
    index: int  # in `LocalCluster.machines` (the controller's machine is the last)
    address: str
    port: int  # its slurmd's
    namespace: str


@dataclass(frozen=True)
class SlurmJob:
    """A job as ``scontrol show job`` last described it."""

    job_id: str
    state: str  # JobState: PENDING, RUNNING, COMPLETED, NODE_FAIL, ...
    restarts: int  # how often SLURM requeued it
    nodes: str  # NodeList, e.g. node[0-1]
    reason: str


class LocalCluster:
    """Call order (one controlling process): ``start`` (or ``with``), then any of ``submit``, ``wait``,
    ``job``, ``scontrol``, ``kill_node``, then ``stop`` (``with`` calls it on every exit)."""

    def __init__(self, root: Path, nodes: int = 3):
        if nodes < 1:
            raise SlurmError(f"a cluster needs at least one node; got nodes={nodes}")
        self.root = Path(root).resolve()
        self.machines = Nodes(nodes + 1, self.root / "local")  # the last one is the controller's
        *node_slots, controller = self.machines.nodes
        self.nodes = tuple(SlurmNode(f"node{k}", k, slot.address, FIRST_SLURMD_PORT + k, slot.namespace)
                           for k, slot in enumerate(node_slots))
        self.controller = SlurmNode(CONTROLLER, controller.index, controller.address, CONTROLLER_PORT,
                                    controller.namespace)
        self.conf = self.root / "slurm.conf"
        # Unix sockets live here (munged's, slurmstepd's in the spool): a path over 108 bytes cannot
        # be one ("Unix socket name exceeded maximum length" ends every job step), and a pytest
        # directory under xdist is longer than that; so they get a short directory of their own
        self.sockets = Path("/tmp") / f"rslurm-{hashlib.sha1(str(self.root).encode()).hexdigest()[:12]}"
        self.socket = self.sockets / "munge.socket"
        self._daemons: dict[str, subprocess.Popen] = {}

    # -- start and stop ---------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> LocalCluster:
        for sub in ("run", "log", "state"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        janitor.register("dir", self.sockets)
        self.sockets.mkdir(exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(self.slurm_conf())
        (self.root / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{address} {name}\n" for name, address in self._hosts()))
        for node in self.nodes:  # what the TaskProlog prints for a task on that node
            (self.root / f"task-env.{node.name}").write_text(
                f"export {NODE_ENV}={node.index}\nexport {NODE_NAMESPACE_ENV}={node.namespace}\n")
        prolog = self.root / "task-prolog"
        prolog.write_text(f'#!/bin/sh\nexec cat "{self.root}/task-env.$SLURMD_NODENAME"\n')
        prolog.chmod(0o755)
        try:
            self.machines.create()
            self._start_daemon("munged", self.controller, [
                "munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
                f"--log-file={self.root / 'log' / 'munged.log'}", f"--pid-file={self.root / 'run' / 'munged.pid'}",
                f"--seed-file={self.root / 'run' / 'munged.seed'}"])
            self._await(lambda: self.socket.exists(), timeout_s, "munged's socket")
            self._start_daemon("slurmctld", self.controller, ["slurmctld", "-D", "-f", str(self.conf)])
            for node in self.nodes:
                self._start_daemon(f"slurmd.{node.name}", node, ["slurmd", "-D", "-N", node.name, "-f", str(self.conf)])
            self._await(lambda: self.idle_nodes() == {n.name for n in self.nodes}, timeout_s, "every node idle")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGKILL everything the cluster runs (every process of every machine, daemons, steps and
        tasks), delete its namespaces; `NetworkError` naming what the kernel kept."""
        try:
            self.machines.destroy()
        finally:
            for daemon in self._daemons.values():
                daemon.wait(timeout=COMMAND_TIMEOUT_S)  # SIGKILLed with their machine: reaped here
                janitor.release("pgid", daemon.pid)
            self._daemons.clear()
            shutil.rmtree(self.sockets, ignore_errors=True)
            janitor.release("dir", self.sockets)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- commands to the cluster ------------------------------------------------------------------
    def environment(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """Run a SLURM client command in the controller's namespace; its stdout, or `SlurmError`."""
        full = ["nsenter", f"--net={NETNS_DIR / self.controller.namespace}", "--", *argv]
        try:
            done = subprocess.run(full, cwd=cwd, env=env or self.environment(), capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(argv)} did not finish within {timeout_s:g} s") from None
        if done.returncode:
            raise SlurmError(f"{' '.join(argv)} exited with status {done.returncode}: "
                             f"{(done.stderr or done.stdout).strip()}")
        return done.stdout

    def scontrol(self, *args: str) -> str:
        return self.command(["scontrol", *args])

    def submit(self, script: Path, *, chdir: Path, output: Path, env: dict[str, str] | None = None,
               options: tuple[str, ...] = ()) -> str:
        """``sbatch`` the script (its working directory ``chdir``, both streams to ``output``, where
        ``%j`` is the job id); returns the job id."""
        return self.command(["sbatch", "--parsable", f"--chdir={chdir}", f"--output={output}", *options,
                             str(script)], cwd=output.parent, env=env).strip().split(";")[0]

    def job(self, job_id: str) -> SlurmJob:
        fields = dict(item.split("=", 1) for item in self.scontrol("show", "job", "-o", job_id).split()
                      if "=" in item)
        return SlurmJob(job_id=job_id, state=fields.get("JobState", "?"), restarts=int(fields.get("Restarts", 0)),
                        nodes=fields.get("NodeList", ""), reason=fields.get("Reason", ""))

    def wait(self, job_id: str, timeout_s: float, *, until=None) -> SlurmJob:
        """Poll the job until it finished (or ``until(job)`` holds); `SlurmError` past ``timeout_s``
        (the job is cancelled then)."""
        def reached() -> SlurmJob | None:
            record = self.job(job_id)
            return record if (until(record) if until else record.state in FINISHED) else None

        record = wait_until(reached, timeout_s, interval_s=0.2)
        if record is None:
            self.command(["scancel", job_id])
            raise SlurmError(f"job {job_id} still {self.job(job_id).state} after {timeout_s:g} s (cancelled)")
        return record

    def idle_nodes(self) -> set[str]:
        try:
            out = self.command(["sinfo", "-h", "-N", "-o", "%N %T"])
        except SlurmError:  # the controller is not answering yet
            return set()
        return {name for name, state in (line.split() for line in out.splitlines()) if state == "idle"}

    def node_processes(self, node: SlurmNode) -> list[int]:
        """Every process in the node's network namespace: its slurmd, slurmstepd, a job's tasks."""
        return self.machines.pids(node.index)

    def kill_node(self, node: SlurmNode) -> list[int]:
        """Lose the node as a machine is lost: every process on it SIGKILLed at once (`Nodes.kill`)."""
        return self.machines.kill(node.index)

    def node(self, name: str) -> SlurmNode:
        return next(node for node in self.nodes if node.name == name)

    # -- its configuration ------------------------------------------------------------------------
    def slurm_conf(self) -> str:
        root = self.root
        lines = [
            "ClusterName=resilience",
            f"SlurmctldHost={CONTROLLER}({self.controller.address})",
            f"SlurmctldPort={CONTROLLER_PORT}",
            "SlurmUser=root", "SlurmdUser=root", f"TaskProlog={root / 'task-prolog'}",
            "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire: a requeued job waits this long before it may start again (default 120 s)
            f"AuthInfo=socket={self.socket},cred_expire={CRED_EXPIRE_S}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={self.sockets / '%n'}",
            f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'run' / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={root / 'log' / 'slurmd.%n.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
            "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MailProg=/bin/true",
            "SelectType=select/linear", "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",  # a requeued job starts within a second of its BeginTime
            "SlurmdParameters=config_overrides",  # the node has the CPUs written here, whatever the machine has
            "ReturnToService=2", "JobRequeue=1",  # a batch job on a failed node is requeued
            "SlurmctldTimeout=10", f"SlurmdTimeout={SLURMD_TIMEOUT_S}", "InactiveLimit=0", "KillWait=2",
            "MinJobAge=600",
        ]
        lines += [f"NodeName={n.name} NodeAddr={n.address} Port={n.port} CPUs=1 RealMemory=1000 State=UNKNOWN"
                  for n in self.nodes]
        lines.append(f"PartitionName=debug Nodes={','.join(n.name for n in self.nodes)} Default=YES "
                     f"MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _hosts(self) -> list[tuple[str, str]]:
        return [(self.controller.name, self.controller.address)] + [(n.name, n.address) for n in self.nodes]

    def _start_daemon(self, name: str, machine: SlurmNode, argv: list[str]) -> None:
        # nsenter, not `ip netns exec` (`Nodes.start`): that one remounts /sys for the namespace, and
        # slurmd 22.05 then fails "No filesystem mounted on /sys/fs/cgroup" whatever its proctrack
        with open(self.root / "log" / f"{name}.out", "wb") as out:
            daemon = subprocess.Popen(
                ["nsenter", f"--net={NETNS_DIR / machine.namespace}", "--", *_NODE_NAMESPACES, "--", "sh", "-c",
                 _ENTER, "sh", str(self.root / "hosts"), machine.name, *argv],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env=self.environment())
        janitor.register("pgid", daemon.pid)
        self._daemons[name] = daemon

    def _await(self, ready, timeout_s: float, what: str) -> None:
        def dead() -> list[str]:
            return [f"{name} exited with status {d.returncode}: {_tail(self.root / 'log' / f'{name}.out')}"
                    for name, d in self._daemons.items() if d.poll() is not None]

        if not wait_until(ready, timeout_s, interval_s=0.1, give_up=lambda: bool(dead())):
            raise SlurmError(f"the SLURM cluster in {self.root} did not reach {what} within {timeout_s:g} s"
                             + ("; " + "; ".join(dead()) if dead() else ""))


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except FileNotFoundError:
        return "(no output)"
