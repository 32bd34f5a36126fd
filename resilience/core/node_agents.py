"""A node agent: the process a checkpoint library keeps beside each node's ranks for the whole job
(DLRover's agent-side saver), and what the harness, the agent and the ranks share about it.

The harness starts one agent per node before the first run (``python -m MODULE``, the module a
strategy names in ``CheckpointStrategy.node_agent``), in a process group of its own, and keeps it
across the restarts of the ranks, as a launcher's agent outlives its workers. Each agent gets a
directory of its own (`agent_dir`) and a name (`agent_name`) that prefixes every host-wide
resource it creates (shared-memory segments, sockets): on a machine that simulates several nodes,
that prefix is the node's own IPC namespace, and the harness removes what carries it once the
agent is gone (a lost node loses its memory).

The agent's protocol, with the files in its directory:
  - it writes ``ready`` once it serves;
  - on SIGUSR1 (the node's workers failed; the restart comes next) it does the agent's duties of
    a failure, then writes ``answered.N`` (N: how many requests it has answered, from 1);
  - on SIGUSR2 (the node's workers succeeded; the job ends) it waits for its background work, then
    writes ``answered.N``;
  - on SIGTERM it releases what it holds and exits 0.
The ranks find their node's agent through ``StrategyContext.node_agent_dir``. An agent module reports
each background save it makes (``persist(step, save)``): a fault armed in the agent hears when the
save of a step began and when it returned (`listen_to_persists`).
"""
from __future__ import annotations

import hashlib
import os
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

DIR_ENV = "RESILIENCE_NODE_AGENT_DIR"  # the agent's directory, in the agent's environment
NAME_ENV = "RESILIENCE_NODE_AGENT_NAME"  # the prefix of its host-wide resources
NODE_ENV = "RESILIENCE_NODE_AGENT_NODE"  # the node it serves
OPTIONS_ENV = "RESILIENCE_NODE_AGENT_OPTIONS"  # the strategy's options, as JSON
READY = "ready"
SHARED_MEMORY = Path("/dev/shm")


_persist_listeners: list[Callable[[int, bool], None]] = []


def listen_to_persists(listener: Callable[[int, bool], None]) -> None:
    """In an agent: ``listener(step, False)`` as each background save of a step begins, and
    ``listener(step, True)`` once it returned."""
    _persist_listeners.append(listener)


def persist(step: int, save: Callable[[], object]) -> object:
    """In an agent: run ``save()``, its background save of ``step``, telling the listeners."""
    for listener in _persist_listeners:
        listener(step, False)
    result = save()
    for listener in _persist_listeners:
        listener(step, True)
    return result


def agent_dir(root: Path, node: int) -> Path:
    """Where node ``node``'s agent of the case whose agents live under ``root`` keeps its files."""
    return Path(root) / f"node{node}"


def agent_name(directory: Path) -> str:
    """The prefix of every host-wide resource of the agent in ``directory``: unique per case and node."""
    return "rsl" + hashlib.sha1(str(Path(directory).resolve()).encode()).hexdigest()[:12]


def answered(directory: Path, count: int) -> Path:
    """The file the agent writes once it answered its ``count``-th request."""
    return Path(directory) / f"answered.{count}"


def serve(directory: Path, workers_failed: Callable[[], None], job_ended: Callable[[], None],
          poll_s: float = 0.05) -> None:
    """The agent's side of the protocol, for every agent module: writes ``ready``, then answers each
    request in order (SIGUSR1: ``workers_failed()``; SIGUSR2: ``job_ended()``; then ``answered.N``)
    until SIGTERM, and returns. Called in the agent once it can serve; the handlers run in its main
    thread, between polls."""
    requests: list[int] = []
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: requests.append(signal.SIGUSR1))
    signal.signal(signal.SIGUSR2, lambda *_: requests.append(signal.SIGUSR2))
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    (Path(directory) / READY).write_text(str(os.getpid()))
    count = 0
    while not stop.wait(poll_s):
        while requests:
            (workers_failed if requests.pop(0) == signal.SIGUSR1 else job_ended)()
            count += 1
            answered(directory, count).write_text("")


class NodeAgentControl(ABC):
    """What a fault may do to the case's node agents (the harness holds them). Called in the harness."""

    @abstractmethod
    def lose(self, node: int) -> None:
        """Node ``node`` is lost: its agent is SIGKILLed and its memory goes with it."""
