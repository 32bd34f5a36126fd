"""A whole node lost at once: its launcher, every rank on it, and optionally its local disk.

The trigger is the kill fault's (rank, step, phase, point, file, ``after_bytes``): the bytes written
before it stay on disk, exactly so many. What dies is the trigger rank's node:

- under torchrun with the nodes on one machine (`resilience.launch.nodes`: each node a network
  namespace, named in the rank's RESILIENCE_NODE_NAMESPACE), the trigger rank itself stops every
  other process of its namespace (the node's torchrun agent, the driver that started it, every
  rank, each in a session of its own), then SIGKILLs them all and itself; so on a user's own
  script whose nodes are namespaces (black-box mode, ``script.nnodes``), whose job is then
  requeued whole on fresh agents, as a scheduler does after a node failure;
- under the local harness, the trigger rank stops itself and the harness SIGKILLs every rank
  the case's topology places on that node (``topology.node_of``), stopped first too.

``local_storage: lost`` (a replaced machine): the node's checkpoint directory is emptied while its
processes are stopped, before they are killed. It needs ``topology.storage: node_local``.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import ClassVar

from ...core.elastic_layout import NODE_NAMESPACE_ENV
from ...core.events import Event
from ...core.janitor import signal_process, stop_all
from ...core.processes import outlive_parent
from ...core.topology import NODE_LOCAL
from ...core.waiting import wait_until
from ...errors import ScenarioError
from ..base import CaseEnvironment
from ..network.netns import is_in_namespace, processes_in_my_namespace
from .kill import Kill

GONE_WAIT_S = 5.0


class NodeLoss(Kill):
    """Rank ``rank``'s whole node SIGKILLed at the trigger point (the kill fault's points)."""

    kind = "node_loss"
    in_timelines = False  # a whole node goes: a timeline does not yet carry node placements per launch
    leaves_saves_alone = False  # local_storage: lost takes the node's files with it
    params: ClassVar[dict] = {"local_storage": (("kept", "lost"), "kept")}
    on_objects = False
    supervises = True  # the local harness kills the node's other ranks
    #: under torchrun the trigger rank ends its own node (it needs nothing from the driver)
    acts_in_its_node: ClassVar[bool] = True

    def __init__(self, spec):
        super().__init__(spec)
        self.lost_ranks: tuple[int, ...] = ()
        self.placement = None
        self.checkpoint_root: Path | None = None
        self.node_agents = None

    # -- harness side -------------------------------------------------------------------------
    def setup(self, env: CaseEnvironment) -> None:
        if env.case is None:  # a user's script: its nodes are namespaces, and the trigger rank ends its own
            return
        self.placement, self.checkpoint_root = env.case.placement, env.checkpoint_dir
        self.node_agents = env.node_agents
        if self.spec.params["local_storage"] == "lost" and self.placement.storage != NODE_LOCAL:
            raise ScenarioError(f"{env.case.source}[{env.case.id}]", "fault.local_storage",
                                f"is 'lost' but topology.storage is {self.placement.storage!r} (shared storage "
                                f"is not the node's to lose)", "lost", "kept; lost with topology.storage node_local")

    def supervise(self, events: list[dict], ranks: list) -> None:
        if self.lost_ranks or not any(e["event"] == Event.FAULT_FIRED and e["rank"] == self.trigger.rank
                                      for e in events):
            return
        node = self.placement.node_of(self.trigger.rank)
        self.lost_ranks = tuple(r for r in range(len(ranks)) if self.placement.node_of(r) == node)
        for rank in self.lost_ranks:
            ranks[rank].signal(signal.SIGSTOP)
        if self.spec.params["local_storage"] == "lost":
            _empty(self.placement.storage_dir(self.checkpoint_root, self.trigger.rank))
        for rank in self.lost_ranks:
            ranks[rank].signal(signal.SIGKILL)
        if self.node_agents is not None:  # the node's agent, and its memory, go with it
            self.node_agents.lose(node)
        wait_until(lambda: all(ranks[r].poll() is not None for r in self.lost_ranks), GONE_WAIT_S, interval_s=0.01)

    def notes(self, env, phases) -> tuple[str, ...]:
        if not self.lost_ranks:
            return ()
        return (f"node {self.placement.node_of(self.trigger.rank)} lost: ranks {list(self.lost_ranks)} "
                f"SIGKILLed at once (local storage {self.spec.params['local_storage']})",)

    # -- rank side ----------------------------------------------------------------------------
    def end(self, forked_writer: bool) -> None:
        namespace = os.environ.get(NODE_NAMESPACE_ENV)
        if not namespace:  # the local harness ends the node (see supervise)
            if forked_writer:
                os.kill(self._armed_pid, signal.SIGSTOP)
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(3600)  # SIGKILLed while stopped; never reached
            return
        if not is_in_namespace(namespace):  # never the machine's own namespace: that is every process
            raise RuntimeError(f"node_loss: {NODE_NAMESPACE_ENV} is {namespace!r}, but this rank is not in "
                               f"that network namespace (or it is the machine's own): refusing to kill it")
        outlive_parent()  # killing its parent must not end this process before the last SIGKILL is sent
        stopped = stop_all(processes_in_my_namespace)
        if self.spec.params["local_storage"] == "lost":
            _empty(self.env.checkpoint_dir)
        for pid in stopped:
            signal_process(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)


def _empty(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
