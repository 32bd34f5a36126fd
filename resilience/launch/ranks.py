"""A live rank, the contract of whatever starts ranks (`ProcessBackend`) and the environment a
rank starts in (`rank_environment`): the harness only talks to these. The backends themselves:
`launch.backend` (spawned ranks, and the choice of backend) and `launch.forked` (ranks forked from
a server with torch preloaded)."""
from __future__ import annotations

import os
import shutil
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from ..core import janitor
from ..core.paths import PROJECT_ROOT, rank_temp_dir
from ..core.plan import PhasePlan
from ..core.processes import process_state
from .interpreters import Interpreter


class RankProcess(ABC):
    """One live rank. Every method is called from the harness process only."""

    rank: int
    pid: int

    @abstractmethod
    def poll(self) -> int | None:
        """Exit status (negative: killed by that signal), or None while running."""

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the rank process itself, unless it has already exited."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def is_stopped(self) -> bool:
        """Whether the rank is stopped (SIGSTOP): it can neither run nor dump its stack."""
        return is_stopped(self.pid)

    @abstractmethod
    def destroy(self) -> None:
        """SIGKILL the rank and every process it started, reap it, and remove its temporary
        directory. Idempotent."""

    def _track(self) -> None:
        """Hand the rank's group and temporary directory to the janitor, in case the harness dies
        before ``destroy``."""
        janitor.register("pgid", self.pid)
        janitor.register("dir", rank_temp_dir(self.pid))

    def _untrack(self) -> None:
        """Last step of ``destroy``: remove the rank's temporary directory; the janitor can forget both."""
        shutil.rmtree(rank_temp_dir(self.pid), ignore_errors=True)
        janitor.release("pgid", self.pid)
        janitor.release("dir", rank_temp_dir(self.pid))


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): it can neither run nor dump its stack."""
    state = process_state(pid)
    return state is not None and state[0] in ("T", "t")


def start_all(count: int, start_one: Callable[[int], RankProcess]) -> list[RankProcess]:
    """Ranks 0..count-1, or none: those already started are destroyed if one fails to start."""
    ranks: list[RankProcess] = []
    try:
        for rank in range(count):
            ranks.append(start_one(rank))
    except BaseException:
        for started in ranks:
            started.destroy()
        raise
    return ranks


class ProcessBackend(ABC):
    """Starts the ranks of a phase.

    Call order (harness process): ``start(plan, plan_path)`` once per phase; the harness polls the
    returned processes; ``destroy()`` on each of them always ends the phase, whatever happened.
    """

    def start(self, plan: PhasePlan, plan_path: Path) -> list[RankProcess]:
        """Every rank of the phase, or none: ranks already started are destroyed if one fails to start."""
        return start_all(plan.world_size, lambda rank: self.start_rank(plan, plan_path, rank))

    @abstractmethod
    def start_rank(self, plan: PhasePlan, plan_path: Path, rank: int) -> RankProcess:
        """Start one rank, writing its stdout and stderr to ``plan.log_paths(rank)``."""

    def start_warm(self, pool_dir: Path, world_size: int) -> list[RankProcess]:
        """Every warm rank of a pool (`resilience.rank.warm_rank`) serving ``pool_dir``, or none.
        Until its first restore a warm rank logs to ``pool_dir/rank<R>.out`` and ``.err``."""
        return start_all(world_size, lambda rank: self.start_warm_rank(pool_dir, rank, world_size))

    @abstractmethod
    def start_warm_rank(self, pool_dir: Path, rank: int, world_size: int) -> RankProcess:
        """Start one warm rank."""


def rank_environment(interpreter: Interpreter | None = None) -> dict[str, str]:
    """Single-threaded, loopback-only ranks that import what the harness imports (a foreign
    interpreter: only this project and the working directory, the rest from its own environment)."""
    inherited = [p for p in sys.path if p] if interpreter is None or interpreter.inherit_path else []
    prefix = list(interpreter.path_prefix) if interpreter else []
    env = dict(os.environ)
    env.update({
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(prefix + [os.getcwd(), str(PROJECT_ROOT)] + inherited),
    })
    return env
