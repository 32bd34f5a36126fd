"""torchrun's agent forked from a server that has already imported it: a launch of this
interpreter's torchrun on this machine skips the second or so its agent spends importing torch
before its rendezvous. The workers it starts are fresh interpreters, as before: the agent runs
torchrun's own ``main`` with the launch's arguments, environment, working directory and output,
in a session of its own, and exits as ``python -m torch.distributed.run`` would (a traceback and
status 1 where ``main`` raises).

What a fresh agent reads as it starts is the server's: a server per set of the variables read
at interpreter start or import (``IMPORT_TIME``), started with the first such launch's
environment; every other variable is read at run time, from the launch's own environment.
A launch another way (another interpreter, through ``ip netns exec``, a spare's standby agent, from
a node's driver in its network namespace, or from a harness run with ``-E`` or ``-I``) starts a
fresh process. Each agent holds its server's pipes; none passes to what the agent starts.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing import forkserver
from pathlib import Path

from ..core.janitor import signal_process
from ..core.processes import is_running
from ..faults.network.netns import is_in_namespace, list_namespaces
from .fork_server import ServerProcess, new_server, stop_server

AGENT_MODULE = "torch.distributed.run"
#: variables read as an interpreter starts or imports torch (Python's, the loader's, torch's own
#: and its loggers' level): agents differing in one come from different servers
IMPORT_TIME = ("PYTHON", "LD_", "TORCH", "PYTORCH", "LOGLEVEL", "OMP_", "GOMP_", "MKL_", "KMP_", "OPENBLAS_",
               "MALLOC", "GLOG_", "LANG", "LC_", "HOME")


class Launcher:
    """A launcher process as `AgentLaunch` drives it: the subset of `subprocess.Popen` it uses."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float) -> int: ...

    def kill(self) -> None: ...


def start_launcher(command: list[str], env: Mapping[str, str], log_path: Path) -> Launcher:
    """Start ``command`` in a session of its own, its output in ``log_path``: an agent of this
    interpreter's torchrun forked warm, anything else as a fresh process."""
    with open(log_path, "wb") as log:
        # -E or -I: a server would not read the variables it is chosen by
        if (command[:3] != [sys.executable, "-m", AGENT_MODULE] or sys.flags.ignore_environment
                or in_a_node_namespace()):
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=dict(env), start_new_session=True)
    return _WarmAgent(command[3:], env, log_path)


def in_a_node_namespace() -> bool:
    """Whether this process runs in a named network namespace (``ip netns``): a node's driver, which
    a node loss kills whole, its janitor included, so that a server's socket directory would
    outlive it. Its launches stay fresh processes, as before."""
    return any(is_in_namespace(name) for name in list_namespaces())


class _WarmAgent(Launcher):
    def __init__(self, args: list[str], env: Mapping[str, str], log_path: Path):
        # the server's start sets (or unsets) each import-time variable as the launch has it
        names = {name for name in {*env, *os.environ} if name.startswith(IMPORT_TIME)}
        import_time = {name: env.get(name) for name in sorted(names)}
        key = tuple(import_time.items())
        self._process = ServerProcess(target=_run_agent, name="torchrun",
                                      args=(args, dict(env), os.getcwd(), str(log_path), os.getpid()),
                                      server=_server(key), prepare=_fresh_argv_and_path,
                                      server_environment=import_time)
        self._process.start()
        self.pid = self._process.pid
        _agents[key] = [agent for agent in _agents.get(key, []) if agent.poll() is None] + [self]

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(AGENT_MODULE, timeout)
        return self._process.exitcode

    def kill(self) -> None:
        """SIGKILL, as `subprocess.Popen.kill`: the agent is no child of ours, the server reaps it."""
        if self._process.exitcode is None:
            signal_process(self.pid, signal.SIGKILL)


#: servers kept at once: each holds an interpreter with torch imported (about 220 MB); beyond this
#: many, the least recently used one with no agent running ends
MAX_SERVERS = 2
_servers: dict[tuple, forkserver.ForkServer] = {}  # least recently used first
_agents: dict[tuple, list[_WarmAgent]] = {}


def _server(key: tuple) -> forkserver.ForkServer:
    if key in _servers:
        _servers[key] = _servers.pop(key)
        return _servers[key]
    for other in list(_servers):
        if len(_servers) < MAX_SERVERS:
            break
        if all(agent.poll() is not None for agent in _agents.get(other, [])):
            stop_server(_servers.pop(other))
            _agents.pop(other, None)
    _servers[key] = new_server([AGENT_MODULE])
    return _servers[key]


def live_agents() -> list[int]:
    """The pids of the warm agents this process started that are still running (their command
    line is their server's, not torchrun's: a search by command line does not find them)."""
    return [agent.pid for agents in _agents.values() for agent in agents if agent.poll() is None]


def _fresh_argv_and_path(data: dict) -> dict:
    """The agent keeps the import path its server's interpreter computed from the launch's
    environment (not this process's), and gets torchrun's argv in `_run_agent`."""
    data.pop("sys_path", None)
    data.pop("sys_argv", None)
    return data


def _run_agent(args: list[str], env: dict[str, str], cwd: str, log_path: str, harness: int) -> None:
    """In the forked agent: what ``python -m torch.distributed.run ARGS`` does, from ``cwd``, with
    ``env``, its output in ``log_path``; nothing where ``harness`` (the pid that asked for it) died
    before the agent's own session began."""
    import tempfile
    import traceback
    from multiprocessing import process

    os.setsid()
    if not is_running(harness):  # its janitor's kill of our group came before the group existed
        os._exit(1)
    for fd in map(int, os.listdir("/proc/self/fd")):  # the server's pipes pass to nothing it starts
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)
    process.current_process()._config.pop("tempdir", None)  # multiprocessing's directory is its own
    nothing = os.open(os.devnull, os.O_RDONLY)  # stdin as `subprocess.DEVNULL` gives a fresh agent
    os.dup2(nothing, 0)
    os.close(nothing)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR is read again, from the launch's environment
    os.chdir(cwd)
    from torch.distributed import run

    if sys.path and sys.path[0] == "":  # the server's ``-c``: ``python -m`` puts the directory there
        sys.path[0] = cwd
    sys.argv = [run.__file__, *args]
    try:
        run.main(args)
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        traceback.print_exc()
        raise SystemExit(1) from None
