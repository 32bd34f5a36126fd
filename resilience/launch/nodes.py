"""Several nodes on one machine (root): each node is a network namespace of its own with its own
address on a bridge, its own node-local directory, and whatever its launcher starts in it.

    with Nodes(3, root=case_dir / "nodes") as nodes:           # nodes 0, 1, 2 (2: a spare)
        nodes[0].address                                        # "10.213.0.1"; node i: 10.213.0.<i + 1>
        agent = nodes.start(0, argv, env, log_path)             # argv run inside node 0 (a Popen)
        nodes.pids(1)                                           # every process in node 1 now
        nodes.kill(1)                                           # the whole node SIGKILLed at once
        nodes.wipe(1)                                           # its local directory emptied (a replaced machine)
    # leaving the block: every node's processes SIGKILLed, the namespaces and local directories removed

The namespaces are the partition fault's (`resilience.faults.network.netns.NamespaceWiring` with ``member="n"``:
``veth0`` in each node, its peer a port of ``br0`` in a switch namespace of the case's own), so
concurrent cases use the same private addresses without seeing each other, and nothing is added
to the host's namespace. Filesystems are not separated: the case directory is the shared storage
every node sees; ``Node.local_dir`` is the directory only that node's ranks should use.

A node's processes are found through its namespace (``ip netns pids``), not through a process
tree: torch elastic starts each worker in a session of its own. `kill` first stops every process in
the node (SIGSTOP, repeated until no new one appears: a process that forks meanwhile is caught in
the next sweep), then SIGKILLs them all, so no process of the node outlives another by more than
the sweep. Everything is registered with the janitor (`resilience.core.janitor`) before it exists:
a harness SIGKILLed half-way leaves no namespace and no process (the janitor SIGKILLs what is in a
namespace before deleting it) and no local directory behind.

Call order (controller process only): construct, enter (or `create`), then any of `start`,
`pids`, `kill`, `wipe`, `alive` in any order, and exit (or `destroy`) exactly once.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..core import janitor
from ..core.elastic_layout import NODE_ENV, NODE_NAMESPACE_ENV
from ..core.waiting import wait_until
from ..errors import NetworkError
from ..faults.network.netns import IFNAME, NamespaceWiring, remove_stale_namespaces

GONE_WAIT_S = 10.0


@dataclass(frozen=True)
class Node:
    """One node: ``index`` (0 hosts the rendezvous), its namespace, address and interface, and
    the directory standing for its local disk."""

    index: int
    namespace: str
    address: str
    ifname: str
    local_dir: Path


def unavailable_reason() -> str | None:
    """Why nodes cannot be built here (the skip reason, naming the fix), or None."""
    if os.geteuid() != 0:
        return "nodes on one machine are network namespaces, which needs root"
    if shutil.which("ip") is None:
        return "nodes on one machine need `ip`, not found on PATH: apt-get install iproute2 (as root)"
    return None


class Nodes:
    """``count`` nodes, each with a local directory ``root/node<i>``."""

    def __init__(self, count: int, root: Path):
        if count < 1:
            raise ValueError(f"a job needs at least one node, not {count}")
        self.root = Path(root)
        self.wiring = NamespaceWiring(count, member="n")
        self.nodes = [Node(index=link["rank"], namespace=link["namespace"], address=link["address"],
                           ifname=IFNAME, local_dir=self.root / f"node{link['rank']}")
                      for link in self.wiring.ranks]
        self._started: list[subprocess.Popen] = []

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    def __len__(self) -> int:
        return len(self.nodes)

    def __enter__(self) -> Nodes:
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def create(self) -> None:
        """Build the namespaces, the bridge and the local directories. A `NetworkError` when the
        kernel or ``ip`` refuses (no CAP_NET_ADMIN, no bridge): nothing is left behind then."""
        remove_stale_namespaces()
        janitor.register("dir", self.root)
        try:
            self.wiring.create()
        except NetworkError:
            self.destroy()
            raise
        for node in self.nodes:
            node.local_dir.mkdir(parents=True, exist_ok=True)

    def start(self, index: int, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        """Run ``argv`` inside node ``index`` (``ip netns exec``, which execs it: the Popen's pid is
        the command's), in a session of its own, stdout and stderr to ``log_path``. Its environment
        is ``env`` plus RESILIENCE_NODE (the index) and RESILIENCE_NODE_NAMESPACE (what the
        node_loss fault ends), which every process it starts inherits."""
        env = {**env, NODE_ENV: str(index), NODE_NAMESPACE_ENV: self.nodes[index].namespace}
        with open(log_path, "ab") as log:
            process = subprocess.Popen(["ip", "netns", "exec", self.nodes[index].namespace, *argv],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        janitor.register("pgid", process.pid)
        self._started.append(process)
        return process

    def pids(self, index: int) -> list[int]:
        """Every process in node ``index`` now."""
        return janitor.namespace_pids(self.nodes[index].namespace)

    def alive(self, index: int) -> bool:
        return bool(self.pids(index))

    def kill(self, index: int) -> list[int]:
        """SIGKILL every process of node ``index`` at once (stopped first, see the module's
        docstring); returns their pids once they are gone."""
        stopped = janitor.stop_all(lambda: self.pids(index))
        for pid in stopped:
            janitor.signal_process(pid, signal.SIGKILL)
        self._reap()
        wait_until(lambda: not self.pids(index), GONE_WAIT_S)
        left = self.pids(index)
        if left:
            raise NetworkError(f"node {index} ({self.nodes[index].namespace}): processes {left} "
                               f"survived SIGKILL for {GONE_WAIT_S:g} s")
        return sorted(stopped)

    def wipe(self, index: int) -> None:
        """Node ``index``'s local disk is gone (a replaced machine): its directory is empty again."""
        directory = self.nodes[index].local_dir
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, exist_ok=True)

    def destroy(self) -> list[str]:
        """Kill every node's processes, delete the namespaces and the local directories.
        Idempotent; raises `NetworkError` naming what the kernel kept."""
        for node in self.nodes:
            if node.namespace in self.wiring.existing():
                self.kill(node.index)
        for process in self._started:
            janitor.release("pgid", process.pid)
        self._started.clear()
        left = self.wiring.destroy()
        shutil.rmtree(self.root, ignore_errors=True)
        janitor.release("dir", self.root)
        if left:
            raise NetworkError(f"network namespaces left behind: {', '.join(left)}")
        return left

    def _reap(self) -> None:
        for process in self._started:
            if process.poll() is None:
                try:
                    process.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
