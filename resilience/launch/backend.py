"""How rank processes are started and stopped. The harness only talks to `ProcessBackend`
(`launch.ranks`); ranks are forked (`launch.forked`, the default) or spawned (`SpawnBackend`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..core.case import Case, Software
from ..core.plan import PhasePlan
from .forked import ForkServerBackend
from .interpreters import Interpreter, for_software
from .ranks import ProcessBackend, RankProcess, is_stopped, rank_environment, start_all

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "ForkServerBackend", "PopenRank", "ProcessBackend", "RankProcess",
           "SpawnBackend", "backend_for_case", "backend_for_launch", "backend_for_software", "is_stopped",
           "rank_environment", "start_all"]


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


def backend_for_software(software: Software, scenario_source: str, key: str) -> ProcessBackend | None:
    """Ranks with packages layered over this environment are forked from a server of their own,
    which preloaded the layered releases; ranks under another interpreter are spawned. None: this
    environment, the harness's own backend."""
    interpreter = for_software(software, scenario_source, key)
    if interpreter is None:
        return None
    if interpreter.python == sys.executable and interpreter.inherit_path:
        return ForkServerBackend(interpreter)
    return SpawnBackend(interpreter)


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
