"""One torchrun launch of a user's script (black-box mode): its command line, its agents, and
whether a launch that went wrong failed in the launcher rather than in the script.

On one node the launch is ``torchrun --standalone``. On several (``nnodes``) each node is a
network namespace of its own on this machine (`resilience.launch.nodes`: 10.213.0.<i + 1> on a
bridge, ``GLOO_SOCKET_IFNAME=veth0``), running its own agent with torchrun's c10d rendezvous hosted
by node 0's agent (``is_host``), as a multi-node job on a cluster runs: the rendezvous, the
group's store (rank 0, at node 0's address) and every collective cross the bridge. Each node's
processes carry RESILIENCE_NODE_NAMESPACE, which ``node_loss`` ends from its trigger rank.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path

from ..core.elastic_layout import NODE_ENV, NODE_NAMESPACE_ENV, Incarnation
from ..core.events import tail
from ..core.paths import PROJECT_ROOT
from ..errors import LauncherFailed, Unavailable
from ..launch.nodes import Node, Nodes, unavailable_reason
from ..oracle.evidence import waiting_place
from .agent_launch import AgentLaunch, AgentLaunches
from .blackbox_records import BlackBoxJob
from .nodes_job import FAST_RDZV, RDZV_PORT
from .supervisor import RankGroup

PLACEHOLDER = "{checkpoint_dir}"
#: frames that are not the script's own in a rank's stack dump: torch's, and the startup hook's
OUTSIDE_THE_SCRIPT = ("/torch/", str(PROJECT_ROOT / "resilience" / "rank"))
#: torchrun's rendezvous errors (torch.distributed.elastic.rendezvous.api), in the agent's output
RENDEZVOUS_FAILURE = re.compile(r"^(?:torch\.distributed\.elastic\.rendezvous\.api\.)?"
                                r"Rendezvous(?:Timeout|Closed|Connection|State)?Error:[^\n]*", re.MULTILINE)


def torchrun_command(job: BlackBoxJob, run_dir: Path, args: tuple[str, ...], restarts: int, ranks: int,
                     node: Node | None = None, host: str | None = None) -> list[str]:
    """``torchrun`` with ``ranks`` ranks on this node: ``--standalone``, or on ``node`` of
    ``job.nnodes`` with the rendezvous at ``host`` (node 0's address); ``{checkpoint_dir}`` names the run's."""
    checkpoint_dir = str(run_dir / "checkpoints")
    where = ["--standalone"] if node is None else [
        "--nnodes", str(job.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:{RDZV_PORT}",
        "--rdzv-id", "job", "--rdzv-conf", f"is_host={int(node.index == 0)},{FAST_RDZV}",
        "--local-addr", node.address]
    return [job.python, "-m", "torch.distributed.run", *where,
            "--nproc-per-node", str(ranks), "--max-restarts", str(restarts),
            "--monitor-interval", "0.1", str(job.script),
            *(arg.replace(PLACEHOLDER, checkpoint_dir) for arg in args)]


def node_log(run_dir: Path, launch: int, node: int = 0) -> Path:
    """Node ``node``'s agent output of launch ``launch`` (node 0's, or the one agent's, unnumbered)."""
    return run_dir / (f"torchrun.launch{launch}.log" if node == 0 else f"torchrun.launch{launch}.node{node}.log")


def start_agents(job: BlackBoxJob, run_dir: Path, launch: int, commands: Callable[[Node | None, str | None], list[str]],
                 env: dict[str, str], event_files: Callable[[], Iterable[Path]], stack: ExitStack) -> RankGroup:
    """The launch's agents: one on this machine, or one per node in namespaces that ``stack``
    removes (after the group is destroyed). ``commands(node, host)``: a node's torchrun command."""
    marker = str(job.script)  # every rank's command line names the script (our torchrun's ranks: see AgentLaunch)
    if job.nnodes == 1:
        return AgentLaunch(commands(None, None), env, node_log(run_dir, launch), event_files, marker=marker)
    reason = unavailable_reason()
    if reason:
        raise Unavailable(f"script.nnodes {job.nnodes} puts each node in a network namespace: {reason}")
    nodes = stack.enter_context(Nodes(job.nnodes, run_dir / f"nodes.launch{launch}"))
    group = AgentLaunches([])
    try:
        for node in nodes.nodes:
            command = ["ip", "netns", "exec", node.namespace, *commands(node, nodes[0].address)]
            node_env = {**env, NODE_ENV: str(node.index), NODE_NAMESPACE_ENV: node.namespace,
                        "GLOO_SOCKET_IFNAME": node.ifname}
            group.launches.append(AgentLaunch(command, node_env, node_log(run_dir, launch, node.index), event_files,
                                              marker=marker))
    except BaseException:
        group.destroy()  # the agents already started, their janitor entries released
        raise
    return group


def check_launcher(job: BlackBoxJob, run_dir: Path, launch: int, command: list[str], failed: bool) -> None:
    """Raise `LauncherFailed` where torchrun started no rank (by its end or its deadline), or
    ended in failure on a rendezvous error it raised (its warnings may name one in passing)."""
    log = "\n".join(node_log(run_dir, launch, node).read_text(errors="replace") for node in range(job.nnodes)
                    if node_log(run_dir, launch, node).exists())
    started = (run_dir / Incarnation(launch, 0).name).is_dir()
    rendezvous = RENDEZVOUS_FAILURE.search(log) if failed else None
    if started and not rendezvous:
        return
    what = "started no rank" if not started else f"failed in its rendezvous ({rendezvous.group(0)})"
    reproduce = shlex.join([f"{name}={value}" for name, value in job.env.items()] + command)
    raise LauncherFailed(f"torchrun {what}: a failure of the launcher, not a verdict on {job.script}; "
                         f"reproduce it with\n  {reproduce}\n{tail(node_log(run_dir, launch))}")


def waiting_places(run_dir: Path, launch: int) -> tuple[str, ...]:
    """Where each rank of a launch that hung waits, from the stack dump it wrote at the deadline."""
    dumps = sorted(run_dir.glob(f"launch{launch}.*/rank*.stacks.txt"))
    return tuple(waiting_place(int(path.name[4:].split(".")[0]), path.read_text(), OUTSIDE_THE_SCRIPT)
                 for path in dumps if path.stat().st_size)
