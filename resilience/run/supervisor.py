"""The one rank-group supervisor: poll a group of rank processes, give survivors of a failure
their grace, enforce the deadline (every live rank dumps its stack first), and always tear the
group down. The harness, `resilience verify`, the torchrun driver and black-box mode all use it.
"""
from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..core import registry
from ..core.case import Case
from ..core.janitor import signal_process
from ..core.plan import PhasePlan
from ..core.records import PhaseResult, PhaseStatus
from ..core.waiting import wait_until
from ..launch.backend import BACKENDS, DEFAULT_BACKEND, ProcessBackend, RankProcess, backend_for_case, is_stopped
from ..oracle.evidence import collect_phase, follow_phase_events, where_waiting

POLL_S = 0.02
STACK_DUMP_WAIT_S = 1.0
TEARDOWN_GRACE_S = 1.0  # how long survivors of a rank failure run on before the group is torn down


@dataclass(frozen=True)
class GroupEnd:
    """How a supervised group ended."""

    status: PhaseStatus  # COMPLETED, FAILED (a member exited non-zero) or DEADLINE
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
    #: how long survivors of a failed member run on before `destroy` (`CheckpointStrategy.failure_grace_s`)
    grace_s: float = TEARDOWN_GRACE_S

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

    def __init__(self, ranks: Sequence[RankProcess], grace_s: float | None = None):
        self.ranks = list(ranks)
        self.grace_s = TEARDOWN_GRACE_S if grace_s is None else grace_s

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


def deadline_after(seconds: float) -> Callable[[], bool]:
    """An ``expired`` for `supervise`: true ``seconds`` from now."""
    until = time.monotonic() + seconds
    return lambda: time.monotonic() > until


def supervise(group: RankGroup, expired: Callable[[], bool], watch: Callable[[], None] | None = None) -> GroupEnd:
    """Run ``group`` to its end. ``expired()``: whether the deadline has passed (checked every poll);
    ``watch()``: called every poll while the group runs (a fault that acts from outside the ranks)."""
    started = time.monotonic()
    status, codes, stopped = PhaseStatus.COMPLETED, [None], frozenset()
    try:
        while True:
            codes = group.poll()
            if group.fails_fast and any(code not in (None, 0) for code in codes):
                status, codes = PhaseStatus.FAILED, _grace(group)
                break
            if all(code is not None for code in codes):
                if any(code != 0 for code in codes):
                    status = PhaseStatus.FAILED
                break
            if watch is not None:
                watch()
            if expired():
                status = PhaseStatus.DEADLINE
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
    if end.status == PhaseStatus.DEADLINE:
        result = replace(result, hang_summary=tuple(
            where_waiting(record, record.rank in end.stopped) for record in result.ranks
            if record.returncode is None))
    return result


def run_local_phase(plan: PhasePlan, case: Case, supervisor=None, backend: ProcessBackend | None = None,
                    default: ProcessBackend | None = None) -> PhaseResult:
    """Start one phase's ranks on this machine (with ``backend``, else the case's software's, else
    ``default``, else a fresh default backend), supervise them to the end (``supervisor``: a fault
    that acts from outside the ranks while they run) and collect them."""
    phase_dir = Path(plan.phase_dir)
    phase_dir.mkdir(parents=True)
    plan_path = phase_dir / "plan.json"
    plan.write(plan_path)
    expired = deadline_after(case.timeouts.phase_s)
    chosen = backend or backend_for_case(case) or default or BACKENDS[DEFAULT_BACKEND]()
    group = LocalRanks(chosen.start(plan, plan_path), registry.resolve("strategy", case.strategy.name).failure_grace_s)
    events = follow_phase_events(plan)
    watch = (lambda: supervisor.supervise(events(), group.ranks)) if supervisor is not None else None
    return collect(plan, supervise(group, expired, watch))


def _grace(group: RankGroup) -> list[int | None]:
    """Like torchrun's agent, notice a failure a moment late: survivors finish the write they are
    in (a peer's death reaches them at their next collective) instead of being cut at a random byte."""
    wait_until(lambda: all(code is not None for code in group.poll()), group.grace_s, interval_s=group.poll_s)
    return group.poll()
