"""Processes forked from a server that has already imported what they run: a fraction of a second
per process instead of the seconds a fresh interpreter spends importing torch. A server is
multiprocessing's forkserver (its own, or one of ours started with an environment of our choice);
it is single-threaded when it forks, and ends once the process that started it is gone. A process
started this way is a real process of its own, signalled and reaped like any.
"""
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Mapping
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, spawn, util

from ..core import janitor
from ..core.waiting import wait_until

#: edits the data a forked child applies before its target runs (import path, argv, working directory)
Preparation = Callable[[dict], dict]


def new_server(preload: list[str]) -> forkserver.ForkServer:
    """A server of our own, started by the first process launched from it, that imports ``preload``."""
    server = forkserver.ForkServer()
    server.set_forkserver_preload(preload)
    return server


class ServerProcess(mp_context.ForkServerProcess):
    """A process forked from ``server`` (None: multiprocessing's own forkserver, with the preload set
    on it). ``prepare``: how the child's preparation data is edited; ``server_environment``: the
    variables set (None: unset) over this process's environment for ``server`` where this start
    brings it up.
    None of the three is sent to the child."""

    def __init__(self, *args, server: forkserver.ForkServer | None = None, prepare: Preparation | None = None,
                 server_environment: Mapping[str, str | None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.server, self.prepare, self.server_environment = server, prepare, server_environment

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(server=None, prepare=None, server_environment=None)  # a lock, a function, secrets
        return state

    @staticmethod
    def _Popen(process_obj):
        return _ServerPopen(process_obj)


class _ServerPopen(popen_forkserver.Popen):
    """Launches a process from its server without re-running the harness's ``__main__`` in it: the
    server imported what the child needs, and a main script without an ``if __name__ ==
    "__main__"`` guard, or a ``<stdin>`` one, must not break or re-run in it."""

    def _launch(self, process_obj):
        server, prepare = process_obj.server, process_obj.prepare
        real_preparation, real_connect = spawn.get_preparation_data, forkserver.connect_to_new_process

        def prepared(name):
            data = real_preparation(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return prepare(data) if prepare else data

        spawn.get_preparation_data = prepared
        try:
            if server is not None:
                _ensure_running(server, process_obj.server_environment)
                forkserver.connect_to_new_process = server.connect_to_new_process
            super()._launch(process_obj)
        finally:
            spawn.get_preparation_data, forkserver.connect_to_new_process = real_preparation, real_connect
        _track_socket_dir()


def stop_server(server: forkserver.ForkServer, deadline_s: float = 10.0) -> None:
    """End ``server`` and reap it, as multiprocessing's own ``ForkServer._stop`` does, within a
    deadline: it exits once every copy of the pipe that tells it we are alive is closed. Only for a
    server with no process of its own still running: each holds a copy, and their exit status
    comes through the server."""
    alive, pid, address = server._forkserver_alive_fd, server._forkserver_pid, server._forkserver_address
    if alive is None or pid is None:
        return
    os.close(alive)
    server._forkserver_alive_fd = server._forkserver_pid = server._forkserver_address = None
    if not wait_until(lambda: os.waitpid(pid, os.WNOHANG) != (0, 0), deadline_s, interval_s=0.01):
        os.kill(pid, signal.SIGKILL)  # a copy of the pipe outlived its process somewhere
        os.waitpid(pid, 0)
    if address and not util.is_abstract_socket_namespace(address):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)


def _ensure_running(server: forkserver.ForkServer, environment: Mapping[str, str | None] | None) -> None:
    """Start ``server`` if it is not running, with ``environment`` set. multiprocessing starts it
    with this process's environment (Python 3.11's forkserver also ignores the import path it is
    handed), so this process's environment carries ``environment`` while it starts."""
    before = {name: os.environ.get(name) for name in environment or {}}
    _set_environment(environment or {})
    try:
        server.ensure_running()
    finally:
        _set_environment(before)


def _set_environment(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _track_socket_dir() -> None:
    """The ``pymp-*`` directory holding the servers' sockets: multiprocessing removes it at a
    normal exit of this process, the janitor when this process is killed. The janitor reads the
    pipe's end of file only once this process is gone, so the two never race."""
    global _socket_dir_tracked
    if not _socket_dir_tracked:
        janitor.register("dir", util.get_temp_dir())
        _socket_dir_tracked = True


_socket_dir_tracked = False
