"""The case's node agents (`resilience.core.node_agents`): one process per node, started before the
first run, kept across the restarts of the ranks, told when the ranks failed or the job ended, and
stopped with the case. Everything here runs in the harness."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from ..core import janitor
from ..core.node_agents import (
    DIR_ENV,
    NAME_ENV,
    NODE_ENV,
    OPTIONS_ENV,
    READY,
    SHARED_MEMORY,
    NodeAgentControl,
    agent_dir,
    agent_name,
    answered,
)
from ..core.records import PhaseStatus
from ..core.waiting import wait_until
from ..errors import HarnessError
from ..launch.backend import rank_environment
from ..launch.interpreters import Interpreter

START_S = 120.0  # an agent imports its library first (seconds on 2 loaded cores)
ANSWER_S = 120.0  # a failure's duties may persist a checkpoint (DLRover waits up to 60 s for it)
STOP_S = 10.0


class NodeAgents(NodeAgentControl):
    """One agent per node of the case, running ``module`` under ``interpreter`` (None: this one),
    given the strategy's ``options``.

    Call order: ``arm(node, environment)`` where a fault acts in an agent; ``start()``; then after
    each launch of the ranks but the last ``after_launch(status, another)`` (``workers_failed()`` or
    ``job_ended()``); ``lose(node)`` from a fault while ranks run; ``stop()`` once, in a ``finally``."""

    def __init__(self, module: str, root: Path, nodes: tuple[int, ...], options: dict,
                 interpreter: Interpreter | None = None):
        self.module, self.root, self.nodes, self.interpreter = module, Path(root), nodes, interpreter
        self.options = json.dumps(options)
        self.processes: dict[int, subprocess.Popen] = {}
        self.requests: dict[int, int] = {}
        self.armed: dict[int, dict[str, str]] = {}  # node -> the environment arming a fault in its next agent

    def arm(self, node: int, environment: dict[str, str]) -> None:
        """Start node ``node``'s next agent with ``environment`` added (`rank.helper_hook`: the fault
        acts in that agent); once: the agent that replaces it runs unarmed."""
        self.armed[node] = environment

    def start(self) -> None:
        """Start every node's agent that is not running, each with a fresh directory, and wait
        until each serves."""
        for node in self.nodes:
            if node not in self.processes:
                self._start(node)
        for node in self.nodes:
            self._wait(node, agent_dir(self.root, node) / READY, START_S, "to start")

    def after_launch(self, status: PhaseStatus, another: bool = True) -> None:
        """What the agents do once a launch of the ranks ended with ``status`` (`PhaseResult.status`);
        ``another``: a launch follows, with the agents it finds (False: they end here, nothing replaces them)."""
        if status == PhaseStatus.COMPLETED:
            self.job_ended(another)
        else:
            self.workers_failed(another)

    def workers_failed(self, another: bool = True) -> None:
        """The ranks failed: each live agent does its duties of a failure; a lost node's agent is
        replaced by a fresh one (a new machine, empty memory), and so is an agent that died alone
        (killed by a fault: the same machine, its memory kept)."""
        self._ask(signal.SIGUSR1)
        if another:
            self.start()
        else:
            self.stop()

    def job_ended(self, another: bool = True) -> None:
        """The ranks finished: each agent waits for its background work, and the job ends with its
        agents (a killed one's memory too); a later launch is a new job, with new agents."""
        for node in self._ask(signal.SIGUSR2):
            self._forget(node)
        self.stop()
        if another:
            self.start()

    def lose(self, node: int) -> None:
        if node in self.processes:
            self._end(node, signal.SIGKILL)

    def stop(self) -> None:
        for node in list(self.processes):
            self._end(node, signal.SIGTERM)

    # -- the parts -----------------------------------------------------------------------------
    def _start(self, node: int) -> None:
        directory = agent_dir(self.root, node)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        name = agent_name(directory)
        env = dict(rank_environment(self.interpreter), **{DIR_ENV: str(directory), NAME_ENV: name,
                                                          NODE_ENV: str(node), OPTIONS_ENV: self.options})
        for key, value in self.armed.pop(node, {}).items():  # a path the armed one adds goes first
            env[key] = os.pathsep.join(filter(None, (value, env.get(key)))) if key == "PYTHONPATH" else value
        python = self.interpreter.python if self.interpreter else sys.executable
        with open(directory / "agent.out", "w") as out, open(directory / "agent.err", "w") as err:
            process = subprocess.Popen([python, "-m", self.module], stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=err, env=env, start_new_session=True, cwd=directory)
        janitor.register("pgid", process.pid)
        self.processes[node], self.requests[node] = process, 0

    def _end(self, node: int, signum: int) -> None:
        """End node ``node``'s agent with ``signum`` (SIGTERM: it releases what it holds first), then
        its process group, and remove what it named with its prefix."""
        process = self.processes.pop(node)
        janitor.signal_process(process.pid, signum)
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            pass
        janitor.kill_group(process.pid)
        process.wait(STOP_S)
        janitor.release("pgid", process.pid)
        self._forget(node)

    def _ask(self, signum: int) -> list[int]:
        """Send every live agent ``signum`` and wait for its answer; returns the nodes whose agent a
        fault had SIGKILLed (before or meanwhile), reaped: ``start`` replaces them."""
        killed = [node for node, process in self.processes.items() if process.poll() == -signal.SIGKILL]
        for node in killed:
            self._reap(node)
        for node, process in self.processes.items():
            self.requests[node] += 1
            janitor.signal_process(process.pid, signum)
        for node in list(self.processes):
            if not self._wait(node, answered(agent_dir(self.root, node), self.requests[node]), ANSWER_S,
                              "to answer", killed_ok=True):
                killed.append(node)
        return killed

    def _wait(self, node: int, path: Path, seconds: float, what: str, killed_ok: bool = False) -> bool:
        """Until the agent wrote ``path`` (True); ``killed_ok``: an agent SIGKILLed meanwhile (a fault
        acting in it, `rank.helper_hook`) is reaped (False), not an error; any other end is one."""
        process = self.processes[node]
        if wait_until(path.exists, seconds, give_up=lambda: process.poll() is not None):
            return True
        if killed_ok and process.poll() == -signal.SIGKILL:
            self._reap(node)
            return False
        err = (agent_dir(self.root, node) / "agent.err").read_text()[-2000:]
        state = f"exited {process.returncode}" if process.returncode is not None else f"no answer in {seconds:.0f} s"
        raise HarnessError(f"node {node}'s agent ({self.module}) failed {what}: {state}\n{err}")

    def _reap(self, node: int) -> None:
        """Node ``node``'s agent was killed alone: end what it left in its group, keep its memory."""
        process = self.processes.pop(node)
        janitor.kill_group(process.pid)
        janitor.release("pgid", process.pid)

    def _forget(self, node: int) -> None:
        """Remove the host-wide resources the node's agent named with its prefix (its memory)."""
        for path in SHARED_MEMORY.glob(f"{agent_name(agent_dir(self.root, node))}*"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
