"""A case as a multi-node torchrun job on this one machine, run as a cluster runs it (root).

    job = run_job_on_nodes(Path("scenarios/x.scenario.yaml"), "case-id", nodes=2, nproc_per_node=2,
                           spares=1, work_dir=tmp)
    [node.verdict_line for node in job.nodes]      # every driver that lived judged the same files

Each node (`resilience.launch.nodes`: a network namespace, its address 10.213.0.<i + 1>) runs the
documented per-node command, ``python -m resilience torchrun SCENARIO --case ID --nnodes N
--nproc-per-node M --rdzv-endpoint <node 0>:29400 --rdzv-id ID --local-addr <its address>
--rdzv-conf is_host=<1 on node 0, else 0>,<timeouts> --case-dir CASE_DIR``, with
GLOO_SOCKET_IFNAME=veth0: the rendezvous, the store and gloo cross the bridge. The case directory
is the shared filesystem; ``CASE_DIR/checkpoints/node<i>`` is node i's local disk.

A node whose driver was SIGKILLed (a ``node_loss``) is replaced, as a scheduler would, by the next
spare node, which joins the running job (``--join``) and is placed after the others (c10d orders
nodes by address). With ``min_nodes`` (``--nnodes MIN:MAX``) no spare is needed: the survivors go on;
``grow_when(case_dir)``: the spares stand by from the start (their drivers loaded, ``--standby``)
and the next one is handed to the job once it holds: its agent joins the running, shrunk job (it
waits to join; the running agents see it through ``num_nodes_waiting`` and restart their groups at
the larger size: docs/torchrun.md, "A spare grows the job back").
Every phase of the job has ``deadline_s``; past it every node's processes are SIGKILLed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.elastic_layout import TorchrunLayout
from ..core.records import PhaseStatus
from ..errors import HarnessError
from ..launch.nodes import Nodes
from .supervisor import RankGroup, deadline_after, supervise

RDZV_PORT = 29400  # each node is a namespace of its own: no other job's port to collide with
#: rendezvous timeouts short enough for tests: a dead node leaves the rendezvous after 2 missed
#: 1 s heartbeats (default 3 x 5 s); the last call waits 10 s (default 30 s) for late nodes: with
#: 1 s an agent started 3 s after node 0's on a loaded machine missed the first round of a
#: --nnodes 1:2 job, which began on node 0 alone
FAST_RDZV = "join_timeout=90,last_call_timeout=10,close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=2"
POLL_S = 0.2


@dataclass(frozen=True)
class NodeRun:
    """One node's driver: its command, how it ended (-9: the node was lost), what it printed."""

    index: int
    command: tuple[str, ...]
    returncode: int | None
    output: str
    started_at: float
    ended_at: float
    handed_at: float | None = None  # a spare standing by: when it was handed to the job (None: never)

    @property
    def lost(self) -> bool:
        return self.returncode == -9 and not self.idle

    @property
    def idle(self) -> bool:
        """A spare that stood by and was never handed to the job (ended with it)."""
        return "--standby" in self.command and self.handed_at is None

    @property
    def verdict_line(self) -> str | None:
        """The line the driver printed for the case (``PASSED RECOVERED expected ...``)."""
        return next((line for line in self.output.splitlines()
                     if line.split(" ", 1)[0] in ("PASSED", "FAILED", "XFAILED", "XPASSED", "ERROR", "SKIPPED")), None)


@dataclass(frozen=True)
class JobOnNodes:
    case_dir: Path
    nodes: tuple[NodeRun, ...]
    elapsed_s: float
    timed_out: bool

    def survivors(self) -> list[NodeRun]:
        return [node for node in self.nodes if not node.lost and not node.idle]


def driver_command(scenario: Path, case_id: str | None, nodes: Nodes, index: int, *, nnodes: int,
                   nproc_per_node: int, case_dir: Path, min_nodes: int | None = None, max_restarts: int = 1,
                   rdzv_conf: str = FAST_RDZV, rdzv_id: str = "job", join: bool = False,
                   startup_s: float = 60.0, standby: Path | None = None) -> list[str]:
    """The per-node command of the docs (docs/torchrun.md, "Several nodes") for node ``index``."""
    node = nodes[index]
    return [sys.executable, "-m", "resilience", "torchrun", str(scenario), *(["--case", case_id] if case_id else []),
            "--nnodes", f"{min_nodes}:{nnodes}" if min_nodes else str(nnodes), "--nproc-per-node", str(nproc_per_node),
            "--max-restarts", str(max_restarts), "--rdzv-endpoint", f"{nodes[0].address}:{RDZV_PORT}",
            "--rdzv-id", rdzv_id, "--local-addr", node.address,
            "--rdzv-conf", f"is_host={int(index == 0)},{rdzv_conf}" if rdzv_conf else f"is_host={int(index == 0)}",
            "--case-dir", str(case_dir), "--startup", f"{startup_s:g}", *(["--join"] if join else []),
            *(["--standby", str(standby)] if standby else [])]


def run_job_on_nodes(scenario: Path, case_id: str | None, *, nodes: int, nproc_per_node: int, work_dir: Path,
                     spares: int = 0, min_nodes: int | None = None, max_restarts: int = 1,
                     rdzv_conf: str = FAST_RDZV, deadline_s: float = 240.0, share_store: bool = True,
                     grow_when: Callable[[Path], bool] | None = None) -> JobOnNodes:
    """Run the case on ``nodes`` nodes (plus ``spares`` idle ones) and return what each driver did.
    ``share_store`` False: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, the ranks get a store of each round's
    own instead of the agents' (a spare joining a later round waits for a MASTER_ADDR key
    otherwise: docs/torchrun.md, "A spare node joining")."""
    case_dir = Path(work_dir) / "case"
    case_dir.mkdir(parents=True, exist_ok=False)
    log_dir = Path(work_dir) / "drivers"
    log_dir.mkdir()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "veth0"}
    if not share_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    started = time.monotonic()
    with Nodes(nodes + spares, TorchrunLayout(case_dir).checkpoint_dir) as machine:
        def start(index: int, join: bool, standby: Path | None = None) -> DriverRun:
            argv = driver_command(scenario, case_id, machine, index, nnodes=nodes, nproc_per_node=nproc_per_node,
                                  case_dir=case_dir, min_nodes=min_nodes, max_restarts=max_restarts,
                                  rdzv_conf=rdzv_conf, join=join, standby=standby)
            log = log_dir / f"node{index}.log"
            return DriverRun(argv, log, machine.start(index, argv, env, log), time.monotonic() - started)

        drivers = NodeDrivers(machine, started, nodes, spares, start, replace_lost=min_nodes is None,
                              grow_when=(lambda: grow_when(case_dir)) if grow_when is not None else None,
                              standby_dir=log_dir)
        end = supervise(drivers, deadline_after(deadline_s), watch=drivers.schedule)
        elapsed = time.monotonic() - started
        results = tuple(NodeRun(index=index, command=tuple(run.argv), returncode=run.process.wait(),
                                output=run.log.read_text(errors="replace"), started_at=run.started_at,
                                ended_at=run.ended_at if run.ended_at is not None else elapsed,
                                handed_at=run.handed_at)
                        for index, run in sorted(drivers.runs.items()))
    if not results:
        raise HarnessError("no node driver started")
    return JobOnNodes(case_dir=case_dir, nodes=results, elapsed_s=elapsed, timed_out=end.status == PhaseStatus.DEADLINE)


@dataclass
class DriverRun:
    """A node driver while the job runs (`NodeRun` once it is over)."""

    argv: list[str]
    log: Path
    process: subprocess.Popen
    started_at: float
    ended_at: float | None = None
    handed_at: float | None = None
    replaced: bool = False  # lost, and a spare started in its place


class NodeDrivers(RankGroup):
    """The nodes' drivers as the one supervisor watches them, playing the scheduler in `schedule`
    (its ``watch``): a lost node (its driver SIGKILLed) is replaced by the next spare, which joins
    the running job; with ``grow_when``, the spares stand by from the start and the next one is
    handed to the job once it holds. A spare standing by counts as done: the job ends without it.

    Failures are the job's own business (torchrun's agents restart their ranks): not ``fails_fast``.
    At the deadline no driver is signalled for a stack dump (each dumps its own ranks' at its own
    deadline); `destroy` SIGKILLs every process of every node."""

    fails_fast = False
    poll_s = POLL_S

    def __init__(self, machine: Nodes, started: float, nodes: int, spares: int,
                 start: Callable[..., DriverRun], *, replace_lost: bool, grow_when: Callable[[], bool] | None,
                 standby_dir: Path):
        self.machine, self.started, self.start, self.replace_lost = machine, started, start, replace_lost
        self.grow_when, self.last = grow_when, nodes + spares
        self.runs = {index: start(index, join=False) for index in range(nodes)}
        self.standby = {index: standby_dir / f"standby.node{index}" for index in range(nodes, nodes + spares)}
        for index in self.standby if grow_when is not None else ():
            self.runs[index] = start(index, join=True, standby=self.standby[index])
        self.next_spare = nodes

    def poll(self) -> list[int | None]:
        for run in self.runs.values():
            if run.ended_at is None and run.process.poll() is not None:
                run.ended_at = time.monotonic() - self.started
        return [0 if self._standing_by(index) else run.process.poll() for index, run in self.runs.items()]

    def schedule(self) -> None:
        for run in list(self.runs.values()):
            lost = run.ended_at is not None and run.process.returncode == -9 and not run.replaced
            if lost and self.replace_lost and self.next_spare < self.last:
                run.replaced = True
                self.runs[self.next_spare] = self.start(self.next_spare, join=True)  # the scheduler replaces it
                self.next_spare += 1
        if self.grow_when is not None and self.next_spare < self.last and self.grow_when():
            self.standby[self.next_spare].touch()  # the scheduler hands a spare to the shrunk elastic job
            self.runs[self.next_spare].handed_at = time.monotonic() - self.started
            self.next_spare += 1

    def live_ranks(self) -> dict[int, int]:
        return {}

    def destroy(self) -> None:
        for index in list(self.runs):  # a deadline, or a node's leftovers: nothing outlives the job
            if self.machine.alive(index):
                self.machine.kill(index)

    def _standing_by(self, index: int) -> bool:
        return index in self.standby and index >= self.next_spare
