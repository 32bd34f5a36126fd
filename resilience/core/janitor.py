"""The safety net behind a harness process: frees what it created when it dies without doing so.

A harness frees its rank processes, mounts, network namespaces and directories itself, in
``finally`` blocks, also on Ctrl-C. Nothing of that runs when the process is SIGKILLed (a
pytest-xdist worker killed mid case, an out-of-memory kill), so every such resource is also
registered here while it exists.

Call order (harness process): ``register(kind, value)`` right before or after creating a resource,
``release(kind, value)`` once it is freed. The first ``register`` starts the janitor, this file run
as a script, in a session of its own (a Ctrl-C at the terminal signals the foreground process
group, not it). It reads the registrations from a pipe whose only writer is the harness, blocking
on it. At end of file (the harness exited, cleanly, on Ctrl-C or SIGKILLed) it frees what is
still registered: SIGKILL to each process group, a lazy unmount of each mount (innermost first),
deletion of each network namespace, removal of each directory; then it exits. A harness that
cleaned up after itself leaves it nothing to do.

Kinds: ``pgid`` (a process group the harness started: a rank leads its own), ``mount`` (a mount
point), ``netns`` (a name under /run/netns: every process still in it is SIGKILLed before it is
deleted, since deleting a namespace ends none of them), ``dir`` (a directory tree).

The janitor runs on the standard library alone, so the harness's one way to signal its own
processes lives here too (``signal_process``, ``kill_group``, ``stop_all``), used on both sides.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

KINDS = ("pgid", "mount", "netns", "dir")
GROUP_EXIT_WAIT_S = 5.0  # for SIGKILLed groups to be gone before their directories are removed
COMMAND_TIMEOUT_S = 30.0
STOP_SWEEPS = 20  # a process forked while a set is being stopped is caught by the next sweep

_lock = threading.Lock()
_janitor: subprocess.Popen | None = None
_janitor_owner: int | None = None  # the pid that started it: a forked child must not share it


# -- harness side ---------------------------------------------------------------------------------
def register(kind: str, value: object) -> None:
    """``value`` of ``kind`` exists now (or is about to): free it if this process dies first."""
    _send("add", kind, value)


def release(kind: str, value: object) -> None:
    """``value`` was freed by its owner: forget it (one registration per call)."""
    _send("drop", kind, value)


@contextmanager
def temporary_directory(prefix: str, parent: Path | None = None, keep: bool = False) -> Iterator[Path]:
    """A fresh directory (``mkdtemp`` under ``parent``, created if needed) removed on exit unless
    ``keep``, and by the janitor if this process dies first."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    if not keep:
        register("dir", path)
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)
            release("dir", path)


def _send(op: str, kind: str, value: object) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown resource kind {kind!r}; allowed: {', '.join(KINDS)}")
    line = json.dumps([op, kind, str(value)]) + "\n"
    with _lock:
        janitor = _running_janitor()
        try:
            janitor.stdin.write(line)
            janitor.stdin.flush()
        except (OSError, ValueError):  # the janitor is gone: the harness's own cleanup still runs
            pass


def _running_janitor() -> subprocess.Popen:
    global _janitor, _janitor_owner
    if _janitor is None or _janitor_owner != os.getpid():
        # -I: only the standard library, whatever PYTHONPATH says. The pipe's write end is not
        # inheritable, so no other child of this process holds it open past our death.
        _janitor = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, text=True, start_new_session=True)
        _janitor_owner = os.getpid()
    return _janitor


# -- janitor side ---------------------------------------------------------------------------------
def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its own session already keeps Ctrl-C away
    registry: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for line in sys.stdin:  # blocks until the harness writes or is gone
        try:
            op, kind, value = json.loads(line)
        except ValueError:  # a line cut by the harness's death
            continue
        if op == "add":
            registry[kind].append(value)
        elif value in registry[kind]:
            registry[kind].remove(value)
    free(registry)


def free(registry: dict[str, list[str]]) -> None:
    """Processes first (they keep mounts busy and write into directories), then mounts, then the
    rest."""
    groups = [int(pgid) for pgid in registry["pgid"]]
    for pgid in groups:
        kill_group(pgid)
    for name in registry["netns"]:  # a node's processes lead sessions of their own (torch elastic's workers)
        for pid in stop_all(lambda name=name: namespace_pids(name)):
            signal_process(pid, signal.SIGKILL)
    _wait_gone(groups)
    for mount in sorted(registry["mount"], key=lambda path: path.count("/"), reverse=True):
        _run(["umount", "-l", mount])  # lazy: a process in its last moments may still hold a file
    for name in registry["netns"]:
        _run(["ip", "netns", "delete", name])
    for directory in registry["dir"]:
        shutil.rmtree(directory, ignore_errors=True)


def namespace_pids(name: str) -> list[int]:
    """The processes in network namespace ``name`` (``ip netns pids``); none when it is gone."""
    try:
        result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(pid) for pid in result.stdout.split() if pid.isdigit()] if result.returncode == 0 else []


# -- shared with the harness: one way to signal processes it started -------------------------------
def signal_process(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid`` unless it is gone (or its pid now names a process not ours)."""
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` (SIGKILL reaches stopped processes too)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(list_pids: Callable[[], Iterable[int]]) -> set[int]:
    """SIGSTOP every process ``list_pids`` names, sweeping again until a sweep finds none new;
    returns those stopped. SIGKILLed afterwards, such a set dies at once: none of its processes
    sees another one die first (a machine losing power), none forks a replacement."""
    stopped: set[int] = set()
    for _ in range(STOP_SWEEPS):
        fresh = set(list_pids()) - stopped
        if not fresh:
            break
        for pid in fresh:
            signal_process(pid, signal.SIGSTOP)
        stopped |= fresh
    return stopped


def _wait_gone(groups: list[int]) -> None:
    deadline = time.monotonic() + GROUP_EXIT_WAIT_S
    for pgid in groups:
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)


def _run(argv: list[str]) -> None:
    try:
        subprocess.run(argv, capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"resilience janitor: {' '.join(argv)}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    main()
