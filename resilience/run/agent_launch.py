"""Launcher processes as rank groups for the supervisor (`resilience.run.supervisor`): one torchrun
agent and the ranks it starts (`AgentLaunch`), one per node of a job on several (`AgentLaunches`),
and a handle per rank for a fault that signals them (`NodeRank`)."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core import janitor
from ..core.events import read_events
from ..core.janitor import kill_group, signal_process
from ..core.processes import process_state
from ..launch.backend import is_stopped
from ..launch.warm_agent import start_launcher
from .supervisor import RankGroup


class AgentLaunch(RankGroup):
    """One launcher process (torchrun) and the ranks it starts, which announce themselves in
    their event files (the first event carries the pid). A rank counts as ours only while its
    command line names ``marker`` (pids are reused) and it descends from our torchrun: on several
    nodes the shared case directory holds every node's event files, and another node's pids name
    other processes here (in a SLURM step with PID namespaces, this node's own driver)."""

    poll_s = 0.2
    fails_fast = False

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path,
                 event_files: Callable[[], Iterable[Path]], marker: str):
        self.event_files, self.marker = event_files, marker
        self.launcher = start_launcher(command, env, log_path)
        janitor.register("pgid", self.launcher.pid)  # the ranks lead their own sessions: see destroy

    def poll(self) -> list[int | None]:
        return [self.launcher.poll()]

    def live_ranks(self, event_files: Iterable[Path] | None = None) -> dict[int, int]:
        """rank -> pid of the ranks alive and ours, from ``event_files`` (default: the launch's)."""
        live = {}
        for path in self.event_files() if event_files is None else event_files:
            for event in read_events(path)[:1]:
                if self._is_ours(event["pid"]):
                    live[event["rank"]] = event["pid"]
        return live

    def rank_handles(self, world_size: int, event_files: Iterable[Path] | None = None) -> list[NodeRank]:
        """A handle per rank of the group for a fault's ``supervise``: this node's live ranks can be
        signalled; another node's are its own driver's (``is_ours`` False, signals go nowhere).
        ``event_files``: one incarnation's, where a restart's ranks must not get its signals."""
        live = self.live_ranks(event_files)
        return [NodeRank(rank, live.get(rank)) for rank in range(world_size)]

    def destroy(self) -> None:
        ranks = self.live_ranks()  # while the agent lives: ours are its descendants
        kill_group(self.launcher.pid)
        self.launcher.kill()  # a warm agent killed before its setsid is in no group of its own yet
        try:
            self.launcher.wait(timeout=30)
        except subprocess.TimeoutExpired:  # uninterruptible IO: the kernel reaps it later
            pass
        for pid in ranks.values():  # they die with the agent too; this makes sure
            try:
                kill_group(os.getpgid(pid))
            except ProcessLookupError:
                pass
        janitor.release("pgid", self.launcher.pid)

    def _is_ours(self, pid: int) -> bool:
        """Named by the marker and below our torchrun: other nodes' ranks (nodes on one machine are
        network namespaces, `resilience.launch.nodes`) descend from their own launchers, and on
        separate machines another node's pid can name any process here, this driver included. Not
        by network namespace: a script's rank may move into one of the case's own (a network fault)."""
        try:
            named = self.marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
        return named and descends_from(pid, self.launcher.pid)


class AgentLaunches(RankGroup):
    """One launcher per node of a job on several nodes (each an `AgentLaunch`, its ranks its own):
    done once every launcher ended."""

    poll_s = AgentLaunch.poll_s
    fails_fast = False

    def __init__(self, launches: Sequence[AgentLaunch]):
        self.launches = list(launches)

    def poll(self) -> list[int | None]:
        return [code for launch in self.launches for code in launch.poll()]

    def live_ranks(self, event_files: Iterable[Path] | None = None) -> dict[int, int]:
        files = None if event_files is None else list(event_files)
        return {rank: pid for launch in self.launches for rank, pid in launch.live_ranks(files).items()}

    def rank_handles(self, world_size: int, event_files: Iterable[Path] | None = None) -> list[NodeRank]:
        live = self.live_ranks(event_files)
        return [NodeRank(rank, live.get(rank)) for rank in range(world_size)]

    def destroy(self) -> None:
        for launch in self.launches:
            launch.destroy()


@dataclass(frozen=True)
class NodeRank:
    """One rank of a job on several nodes, as a node's driver sees it (``pid`` None: not on this node)."""

    rank: int
    pid: int | None

    @property
    def is_ours(self) -> bool:
        return self.pid is not None

    def poll(self) -> int | None:
        return None if self.pid is not None and Path(f"/proc/{self.pid}").exists() else 0

    def signal(self, signum: int) -> None:
        if self.pid is not None:
            signal_process(self.pid, signum)

    def is_stopped(self) -> bool:
        return self.pid is not None and is_stopped(self.pid)


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or below it in the process tree (read from /proc)."""
    while pid > 1:
        if pid == ancestor:
            return True
        state = process_state(pid)
        if state is None:
            return False
        pid = state[1]
    return False
