"""This process and others as the kernel sees them: ``/proc/<pid>/stat`` read by the one parser,
the CPU time of a process tree, the one request to die with the parent process
(PR_SET_PDEATHSIG), made and undone, and the request to reap orphans (PR_SET_CHILD_SUBREAPER)."""
from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, which may hold spaces and
    parentheses itself (so they are read after the last one); None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def process_state(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of process ``pid`` (state: ``R``, ``S``, ``T`` stopped, ``Z`` exited
    and not yet reaped, ...), or None when there is no such process."""
    fields = _stat_fields(pid)
    try:
        return fields[0], int(fields[1])
    except (TypeError, IndexError, ValueError):
        return None


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user and system) spent so far by process ``root`` and every descendant: the
    live ones, and those reaped by a process of the tree (the kernel adds a reaped child's time,
    its own reaped children's included, to its parent's). Read twice, the difference is what the
    tree spent in between, even where a process started and was reaped in between: a rank forked
    by a fork server and reaped by it, torchrun's workers. Time of a process that left the tree
    unreaped (re-parented to init) is not counted."""
    children: dict[int, list[int]] = {}
    spent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat_fields(entry.name) if entry.name.isdigit() else None
        try:  # after the name: state, ppid, ..., utime stime cutime cstime at 11 to 14
            parent, ticks = int(fields[1]), sum(int(value) for value in fields[11:15])
        except (TypeError, IndexError, ValueError):
            continue  # gone meanwhile, or not a process
        children.setdefault(parent, []).append(int(entry.name))
        spent[int(entry.name)] = ticks
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total += spent.get(pid, 0)
        pending.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


def is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has: its parent has yet to reap it)."""
    state = process_state(pid)
    return state is not None and state[0] != "Z"


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (for a rank: the harness, or the
    forkserver, which itself exits with the harness), so nothing outlives the run; exit at once
    with status 3 when the parent is already gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(3)


def outlive_parent() -> None:
    """Undo `die_with_parent` for this process (one that must finish a job its parent's death starts)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0)


def become_subreaper() -> bool:
    """Make this process the parent of its descendants' orphans, instead of init (not inherited by
    the children it forks); it must reap them. False where the kernel cannot."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
