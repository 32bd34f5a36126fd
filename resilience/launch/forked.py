"""Ranks forked from a server that has already imported torch, the worker and each installed stack
(``resilience.rank.zygote``): about a tenth of a second per rank instead of the seconds a fresh
interpreter spends importing them. A rank is still a real process in its own session, SIGKILLed
or SIGSTOPped like any; the server is single-threaded when it forks.

This environment's ranks come from multiprocessing's own forkserver. Ranks with packages layered
over this environment (`Case.software`: another release of DeepSpeed, the stacks that cannot share
it) come from a server of their own per set of layers, started on first use with the layers first
on its import path, so that it preloads the layered releases; each rank inherits that path.
"""
from __future__ import annotations

import os
import signal
from functools import partial
from multiprocessing import forkserver
from pathlib import Path

from ..core.plan import PhasePlan
from .fork_server import ServerProcess, new_server
from .interpreters import Interpreter
from .ranks import ProcessBackend, RankProcess, rank_environment

PRELOAD = ["resilience.rank.orphan_reaper", "resilience.rank.zygote"]  # the reaper first: before any rank


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


def _forked_rank(plan_path: str, rank: int, out_path: str, err_path: str, python_path: str | None) -> None:
    """Runs in the forked rank, where the server already imported the zygote: importing it here
    keeps the harness process itself free of torch's warm-up. ``python_path``: what a process the
    rank starts needs on its path to see the layers too."""
    if python_path is not None:
        os.environ["PYTHONPATH"] = python_path
    from ..rank.zygote import run_rank

    run_rank(plan_path, rank, out_path, err_path)


def _forked_warm_rank(pool_dir: str, rank: int, world_size: int, python_path: str | None) -> None:
    if python_path is not None:
        os.environ["PYTHONPATH"] = python_path
    from ..rank.zygote import run_warm_rank

    run_warm_rank(pool_dir, rank, world_size)


class ForkServerBackend(ProcessBackend):
    """Ranks forked from a server that preloaded torch and the worker. ``layered``: an interpreter
    that is this one with packages layered first on its path (None: this environment,
    multiprocessing's own forkserver); its ranks get the ``PYTHONPATH`` a spawned rank of it would
    (`rank_environment`), for the processes they start."""

    def __init__(self, layered: Interpreter | None = None):
        import multiprocessing

        self.layers = layered.path_prefix if layered else ()
        self.python_path = rank_environment(layered)["PYTHONPATH"] if layered else None
        self._server = _layered_server(self.layers) if layered else None
        # the layered server's import path is the ranks' own (it preloads the layered releases)
        self._server_environment = {"PYTHONPATH": self.python_path} if layered else None
        if not layered:
            multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)

    def start_rank(self, plan: PhasePlan, plan_path: Path, rank: int) -> RankProcess:
        out_path, err_path = plan.log_paths(rank)
        return self._start(_forked_rank, f"rank{rank}", rank,
                           (str(plan_path), rank, str(out_path), str(err_path), self.python_path))

    def start_warm_rank(self, pool_dir: Path, rank: int, world_size: int) -> RankProcess:
        return self._start(_forked_warm_rank, f"warm{rank}", rank, (str(pool_dir), rank, world_size, self.python_path))

    def _start(self, target, name: str, rank: int, args: tuple) -> RankProcess:
        process = ServerProcess(target=target, name=name, args=args, server=self._server,
                                prepare=partial(_layers_first, self.layers) if self.layers else None,
                                server_environment=self._server_environment)
        process.start()
        return _ForkedRank(rank, process)


_layered_servers: dict[tuple[str, ...], forkserver.ForkServer] = {}


def _layered_server(layers: tuple[str, ...]) -> forkserver.ForkServer:
    """The server of ranks with ``layers``: one per harness process, started by its first rank,
    ending, as multiprocessing's own, once this process and every rank it forked are gone."""
    if layers not in _layered_servers:
        _layered_servers[layers] = new_server(PRELOAD)
    return _layered_servers[layers]


def _layers_first(layers: tuple[str, ...], data: dict) -> dict:
    """A layered rank's import path begins with the layers."""
    data["sys_path"] = [*layers, *data["sys_path"]]
    return data
