"""How rank processes are started and stopped. The harness only talks to `ProcessBackend`."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing import context as mp_context
from multiprocessing import popen_forkserver, spawn
from pathlib import Path

from ..core import janitor
from ..core.case import Case, Software
from ..core.paths import PROJECT_ROOT, rank_temp_dir
from ..core.plan import PhasePlan
from ..core.processes import process_state
from .interpreters import Interpreter, for_software


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


class PopenRank(RankProcess):
    def __init__(self, rank: int, popen: subprocess.Popen):
        self.rank, self._popen, self.pid = rank, popen, popen.pid
        self._destroyed = False
        self._track()

    def poll(self) -> int | None:
        return self._popen.poll()

    def destroy(self) -> None:
        if self._destroyed:  # once reaped, the pid may already lead someone else's group
            return
        self._destroyed = True
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
        self._untrack()


class SpawnBackend(ProcessBackend):
    """A fresh Python interpreter per rank (``python -m resilience.rank.worker``): slow to start, simple.
    ``interpreter`` runs the ranks under another Python or with packages layered first on the path."""

    def __init__(self, interpreter: Interpreter | None = None):
        self.interpreter = interpreter

    def start_rank(self, plan: PhasePlan, plan_path: Path, rank: int) -> RankProcess:
        out_path, err_path = plan.log_paths(rank)
        python = self.interpreter.python if self.interpreter else sys.executable
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            popen = subprocess.Popen(
                [python, "-m", "resilience.rank.worker", str(plan_path), str(rank)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=rank_environment(self.interpreter),
                start_new_session=True)
        return PopenRank(rank, popen)

    def start_warm_rank(self, pool_dir: Path, rank: int, world_size: int) -> RankProcess:
        python = self.interpreter.python if self.interpreter else sys.executable
        with open(pool_dir / f"rank{rank}.out", "wb") as out, open(pool_dir / f"rank{rank}.err", "wb") as err:
            popen = subprocess.Popen(
                [python, "-m", "resilience.rank.warm_rank", str(pool_dir), str(rank), str(world_size)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=rank_environment(self.interpreter),
                start_new_session=True)
        return PopenRank(rank, popen)


class _ForkedRank(RankProcess):
    def __init__(self, rank: int, process):
        self.rank, self._process, self.pid = rank, process, process.pid
        self._track()

    def poll(self) -> int | None:
        return self._process.exitcode

    def destroy(self) -> None:
        if self._process._closed:  # destroyed already
            return
        for kill in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
            try:  # the group once the rank called setsid; the process itself in case it had not yet
                kill()
            except (ProcessLookupError, PermissionError):
                pass
        self._process.join(timeout=30)
        if self._process.exitcode is not None:
            self._process.close()
        self._untrack()


class _NoMainPopen(popen_forkserver.Popen):
    """Launches a forkserver rank without re-running the harness's ``__main__`` in it: ranks need
    only ``resilience.rank.zygote`` (already in the server), and a main script without an
    ``if __name__ == "__main__"`` guard, or a ``<stdin>`` one, must not break or re-run in them."""

    def _launch(self, process_obj):
        real = spawn.get_preparation_data

        def without_main(name):
            data = real(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            super()._launch(process_obj)
        finally:
            spawn.get_preparation_data = real


class _RankProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _NoMainPopen(process_obj)


def _forked_rank(plan_path: str, rank: int, out_path: str, err_path: str) -> None:
    """Runs in the forked rank, where the server already imported the zygote: importing it here
    keeps the harness process itself free of torch's warm-up."""
    from ..rank.zygote import run_rank

    run_rank(plan_path, rank, out_path, err_path)


def _forked_warm_rank(pool_dir: str, rank: int, world_size: int) -> None:
    from ..rank.zygote import run_warm_rank

    run_warm_rank(pool_dir, rank, world_size)


class ForkServerBackend(ProcessBackend):
    """Ranks forked from a multiprocessing forkserver that preloaded torch and the worker
    (``resilience.rank.zygote``): about a tenth of a second per rank instead of seconds. Ranks are
    still real processes in their own session; the server is single-threaded when it forks."""

    def __init__(self):
        import multiprocessing

        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["resilience.rank.zygote"])

    def start_rank(self, plan: PhasePlan, plan_path: Path, rank: int) -> RankProcess:
        out_path, err_path = plan.log_paths(rank)
        process = _RankProcess(target=_forked_rank, name=f"rank{rank}",
                               args=(str(plan_path), rank, str(out_path), str(err_path)))
        process.start()
        _track_forkserver_socket_dir()
        return _ForkedRank(rank, process)

    def start_warm_rank(self, pool_dir: Path, rank: int, world_size: int) -> RankProcess:
        process = _RankProcess(target=_forked_warm_rank, name=f"warm{rank}", args=(str(pool_dir), rank, world_size))
        process.start()
        _track_forkserver_socket_dir()
        return _ForkedRank(rank, process)


def _track_forkserver_socket_dir() -> None:
    """The ``pymp-*`` directory holding the forkserver's socket: multiprocessing removes it at a
    normal exit of this process, the janitor when this process is killed. The janitor reads the
    pipe's end of file only once this process is gone, so the two never race."""
    from multiprocessing import util

    global _socket_dir_tracked
    if not _socket_dir_tracked:
        janitor.register("dir", util.get_temp_dir())
        _socket_dir_tracked = True


_socket_dir_tracked = False


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


def backend_for_software(software: Software, scenario_source: str, key: str) -> ProcessBackend | None:
    """Ranks under another interpreter or with layered packages are spawned, since the forkserver
    holds this environment's modules. None: this environment, the harness's own backend."""
    interpreter = for_software(software, scenario_source, key)
    return SpawnBackend(interpreter) if interpreter else None


def backend_for_case(case: Case) -> ProcessBackend | None:
    """The backend of the case's reference, first run and checks (`Case.software`)."""
    return backend_for_software(case.software, case.source, "software")


def backend_for_launch(case: Case, index: int) -> ProcessBackend | None:
    """The backend of launch ``index`` (0: the first run; 1: the restart; then a timeline's) and
    of the continuation judging it (`Case.launch_software`): an upgrade to qualify, or the case's."""
    own = index >= 1 and case.incarnations[index - 1].restart.software
    key = ("restart" if index == 1 and not case.timeline else f"timeline.{index}") if own else "software"
    return backend_for_software(case.launch_software(index), case.source, key)


BACKENDS = {"fork": ForkServerBackend, "spawn": SpawnBackend}
DEFAULT_BACKEND = "fork"
