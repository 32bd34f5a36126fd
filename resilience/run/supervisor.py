"""The one rank-group supervisor: poll a group of rank processes, give survivors of a failure
their grace, enforce the deadline (every live rank dumps its stack first), and always tear the
group down. The harness, `resilience verify`, the torchrun driver and black-box mode all use it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..core import janitor
from ..core.events import read_events
from ..core.janitor import kill_group, signal_process
from ..core.plan import PhasePlan
from ..core.processes import process_state
from ..core.records import PhaseResult
from ..launch.backend import RankProcess, is_stopped
from ..oracle.evidence import collect_phase, where_waiting

POLL_S = 0.02
STACK_DUMP_WAIT_S = 1.0
TEARDOWN_GRACE_S = 1.0  # how long survivors of a rank failure run on before the group is torn down


@dataclass(frozen=True)
class GroupEnd:
    """How a supervised group ended."""

    status: str  # "completed", "failed" (a member exited non-zero) or "deadline"
    codes: tuple[int | None, ...]  # each member's exit status; None: still running when torn down
    stopped: frozenset[int]  # at a deadline: ranks that were stopped (SIGSTOP), so dumped no stack
    elapsed_s: float


class RankGroup(ABC):
    """Processes one supervisor watches, from the controller process only.

    Call order: `poll` every ``poll_s`` seconds until the group finishes, fails or passes its
    deadline; at a deadline `live_ranks` (their stacks are dumped with SIGUSR1); `destroy` exactly
    once at the end, whatever happened.
    """

    poll_s: float = POLL_S
    #: True: a member that fails ends the group after TEARDOWN_GRACE_S, as torchrun's agent does.
    #: False: a launcher inside the group handles failures itself (torchrun's agent restarts ranks).
    fails_fast: bool = True

    @abstractmethod
    def poll(self) -> list[int | None]:
        """The members' exit statuses (None while running); the group is done when none is None."""

    @abstractmethod
    def live_ranks(self) -> dict[int, int]:
        """rank -> pid of the rank processes running now."""

    @abstractmethod
    def destroy(self) -> None:
        """SIGKILL every member and whatever it started, and reap them. Idempotent."""


class LocalRanks(RankGroup):
    """The ranks a `ProcessBackend` started: one member per rank."""

    def __init__(self, ranks: Sequence[RankProcess]):
        self.ranks = list(ranks)

    def poll(self) -> list[int | None]:
        return [r.poll() for r in self.ranks]

    def live_ranks(self) -> dict[int, int]:
        return {r.rank: r.pid for r in self.ranks if r.poll() is None}

    def destroy(self) -> None:
        for rank in self.ranks:
            rank.destroy()


class WarmRanks(RankGroup):
    """A pool's live ranks (`resilience.run.warm_pool`) running one restore: a member is done once
    ``answered(rank)`` gives the exit status a fresh rank would have had (0, or 1: it raised),
    failed once its process exited without answering.

    `destroy` ends the restore, not the processes, when every member answered, left nothing behind
    (``left_behind(rank)``) and is still alive: they stay for the next restore. Otherwise (a member
    died, hung, or exited because the restore left state in it) every member is killed and ``spent``
    is set: the pool starts new ones.
    """

    # a warm restore takes 10-20 ms: polling at the phases' 20 ms would double it; a poll reads
    # one small file per member
    poll_s = 0.002

    def __init__(self, ranks: Sequence[RankProcess], answered: Callable[[int], int | None],
                 left_behind: Callable[[int], list[str]]):
        self.ranks, self.answered, self.left_behind, self.spent = list(ranks), answered, left_behind, False

    def poll(self) -> list[int | None]:
        codes = []
        for rank in self.ranks:
            code, answer = rank.poll(), self.answered(rank.rank)
            if answer is not None:
                codes.append(answer)
            else:
                codes.append(None if code is None else (code or 1))  # gone without an answer: failed
        return codes

    def live_ranks(self) -> dict[int, int]:
        return {r.rank: r.pid for r in self.ranks if r.poll() is None and self.answered(r.rank) is None}

    def destroy(self) -> None:
        # a member that answered with leftovers is exiting: asking whether it is alive would race it
        if all(self.answered(r.rank) is not None and not self.left_behind(r.rank) and r.poll() is None
               for r in self.ranks):
            return
        self.spent = True
        for rank in self.ranks:
            rank.destroy()


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
        with open(log_path, "wb") as log:
            self.launcher = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env=env, start_new_session=True)
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


def deadline_after(seconds: float) -> Callable[[], bool]:
    """An ``expired`` for `supervise`: true ``seconds`` from now."""
    until = time.monotonic() + seconds
    return lambda: time.monotonic() > until


def supervise(group: RankGroup, expired: Callable[[], bool], watch: Callable[[], None] | None = None) -> GroupEnd:
    """Run ``group`` to its end. ``expired()``: whether the deadline has passed (checked every poll);
    ``watch()``: called every poll while the group runs (a fault that acts from outside the ranks)."""
    started = time.monotonic()
    status, codes, stopped = "completed", [None], frozenset()
    try:
        while True:
            codes = group.poll()
            if group.fails_fast and any(code not in (None, 0) for code in codes):
                status, codes = "failed", _grace(group)
                break
            if all(code is not None for code in codes):
                if any(code != 0 for code in codes):
                    status = "failed"
                break
            if watch is not None:
                watch()
            if expired():
                status = "deadline"
                live = group.live_ranks()
                stopped = frozenset(rank for rank, pid in live.items() if is_stopped(pid))
                for pid in live.values():  # faulthandler in each rank prints every thread's stack
                    signal_process(pid, signal.SIGUSR1)
                time.sleep(STACK_DUMP_WAIT_S)
                break
            time.sleep(group.poll_s)
    finally:
        group.destroy()
    return GroupEnd(status=status, codes=tuple(codes), stopped=stopped, elapsed_s=time.monotonic() - started)


def collect(plan: PhasePlan, end: GroupEnd) -> PhaseResult:
    """The phase's result from its ranks' files and how the group ended (at a deadline: where
    each rank still running waits)."""
    result = collect_phase(plan, end.status, list(end.codes), end.elapsed_s)
    if end.status == "deadline":
        result = replace(result, hang_summary=tuple(
            where_waiting(record, record.rank in end.stopped) for record in result.ranks
            if record.returncode is None))
    return result


def _grace(group: RankGroup) -> list[int | None]:
    """Like torchrun's agent, notice a failure a moment late: survivors finish the write they are
    in (a peer's death reaches them at their next collective) instead of being cut at a random byte."""
    until = time.monotonic() + TEARDOWN_GRACE_S
    codes = group.poll()
    while time.monotonic() < until and any(code is None for code in codes):
        time.sleep(group.poll_s)
        codes = group.poll()
    return codes
