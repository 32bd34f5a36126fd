"""How rank processes are started and stopped. The harness only talks to `ProcessBackend`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path

from .phases import PhasePlan


class RankProcess(ABC):
    """One live rank. Every method is called from the harness process only."""

    rank: int
    pid: int

    @abstractmethod
    def poll(self) -> int | None:
        """Exit status (negative: killed by that signal), or None while running."""

    @abstractmethod
    def signal(self, signum: int) -> None:
        """Send ``signum`` to the rank process itself."""

    @abstractmethod
    def destroy(self) -> None:
        """SIGKILL the rank and every process it started, and reap it. Idempotent."""


class ProcessBackend(ABC):
    """Starts the ranks of a phase.

    Call order (harness process): ``start(plan, plan_path)`` once per phase; the harness polls the
    returned processes; ``destroy()`` on each of them always ends the phase, whatever happened.
    """

    @abstractmethod
    def start(self, plan: PhasePlan, plan_path: Path) -> list[RankProcess]:
        ...


class _PopenRank(RankProcess):
    def __init__(self, rank: int, popen: subprocess.Popen):
        self.rank, self._popen, self.pid = rank, popen, popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def signal(self, signum: int) -> None:
        if self._popen.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def destroy(self) -> None:
        # The rank leads its own process group (start_new_session), so this also reaches helper
        # processes a library started; SIGKILL works on stopped processes too.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self._popen.wait(timeout=30)
        except subprocess.TimeoutExpired:  # uninterruptible IO: the kernel will reap it later
            pass


class SpawnBackend(ProcessBackend):
    """A fresh Python interpreter per rank (``python -m resilience.worker``): slow to start, simple."""

    def start(self, plan: PhasePlan, plan_path: Path) -> list[RankProcess]:
        env = rank_environment()
        ranks: list[RankProcess] = []
        try:
            for rank in range(plan.world_size):
                out_path, err_path = plan.log_paths(rank)
                with open(out_path, "wb") as out, open(err_path, "wb") as err:
                    popen = subprocess.Popen(
                        [sys.executable, "-m", "resilience.worker", str(plan_path), str(rank)],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True)
                ranks.append(_PopenRank(rank, popen))
        except BaseException:
            for started in ranks:
                started.destroy()
            raise
        return ranks


def rank_environment() -> dict[str, str]:
    """Single-threaded, loopback-only ranks that import what the harness imports."""
    env = dict(os.environ)
    env.update({
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([os.getcwd()] + [p for p in sys.path if p]),
    })
    return env


BACKENDS = {"spawn": SpawnBackend}
