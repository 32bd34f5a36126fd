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
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, spawn, util
from pathlib import Path

from ..core import janitor
from ..core.plan import PhasePlan
from .interpreters import Interpreter
from .ranks import ProcessBackend, RankProcess, rank_environment

PRELOAD = ["resilience.rank.zygote"]


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


class _ServerPopen(popen_forkserver.Popen):
    """Launches a rank from its server without re-running the harness's ``__main__`` in it: ranks
    need only ``resilience.rank.zygote`` (already in the server), and a main script without an
    ``if __name__ == "__main__"`` guard, or a ``<stdin>`` one, must not break or re-run in them.
    A layered rank's server is its own, and its import path (the server's too, when this launch
    starts it) begins with the layers."""

    def _launch(self, process_obj):
        server, layers = process_obj.server, process_obj.layers
        real_preparation, real_connect = spawn.get_preparation_data, forkserver.connect_to_new_process

        def prepared(name):
            data = real_preparation(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            if layers:
                data["sys_path"] = [*layers, *data["sys_path"]]
            return data

        spawn.get_preparation_data = prepared
        try:
            if server is not None:
                _ensure_running(server, process_obj.python_path)
                forkserver.connect_to_new_process = server.connect_to_new_process
            super()._launch(process_obj)
        finally:
            spawn.get_preparation_data, forkserver.connect_to_new_process = real_preparation, real_connect


def _ensure_running(server: forkserver.ForkServer, python_path: str) -> None:
    """Start a layered server with the layers on its import path. multiprocessing's server takes
    its path from its environment (Python 3.11's forkserver ignores the path it is handed), so the
    environment it inherits carries ``python_path`` while it starts."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = python_path
    try:
        server.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


class _RankProcess(mp_context.ForkServerProcess):
    """A rank as multiprocessing starts it. ``server``: a layered server (None: multiprocessing's
    own), never sent to the rank; ``layers``: what goes first on the rank's import path;
    ``python_path``: the layered server's and its ranks' ``PYTHONPATH``."""

    def __init__(self, *args, server: forkserver.ForkServer | None = None, layers: tuple[str, ...] = (),
                 python_path: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.server, self.layers, self.python_path = server, layers, python_path

    def __getstate__(self):
        state = dict(self.__dict__)
        state["server"] = None  # holds a lock; the rank has no use for it
        return state

    @staticmethod
    def _Popen(process_obj):
        return _ServerPopen(process_obj)


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
        if not layered:
            multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)

    def start_rank(self, plan: PhasePlan, plan_path: Path, rank: int) -> RankProcess:
        out_path, err_path = plan.log_paths(rank)
        return self._start(_forked_rank, f"rank{rank}", rank,
                           (str(plan_path), rank, str(out_path), str(err_path), self.python_path))

    def start_warm_rank(self, pool_dir: Path, rank: int, world_size: int) -> RankProcess:
        return self._start(_forked_warm_rank, f"warm{rank}", rank, (str(pool_dir), rank, world_size, self.python_path))

    def _start(self, target, name: str, rank: int, args: tuple) -> RankProcess:
        process = _RankProcess(target=target, name=name, args=args, server=self._server, layers=self.layers,
                               python_path=self.python_path)
        process.start()
        _track_socket_dir()
        return _ForkedRank(rank, process)


_layered_servers: dict[tuple[str, ...], forkserver.ForkServer] = {}


def _layered_server(layers: tuple[str, ...]) -> forkserver.ForkServer:
    """The server of ranks with ``layers``: one per harness process, started by its first rank,
    ending, as multiprocessing's own, once this process and every rank it forked are gone."""
    if layers not in _layered_servers:
        server = forkserver.ForkServer()
        server.set_forkserver_preload(PRELOAD)
        _layered_servers[layers] = server
    return _layered_servers[layers]


def _track_socket_dir() -> None:
    """The ``pymp-*`` directory holding the servers' sockets: multiprocessing removes it at a
    normal exit of this process, the janitor when this process is killed. The janitor reads the
    pipe's end of file only once this process is gone, so the two never race."""
    global _socket_dir_tracked
    if not _socket_dir_tracked:
        janitor.register("dir", util.get_temp_dir())
        _socket_dir_tracked = True


_socket_dir_tracked = False
