"""This process and others as the kernel sees them: ``/proc/<pid>/stat`` read by the one parser,
and the one request to die with the parent process (PR_SET_PDEATHSIG), made and undone."""
from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

PR_SET_PDEATHSIG = 1


def process_state(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of process ``pid`` (state: ``R``, ``S``, ``T`` stopped, ``Z`` exited
    and not yet reaped, ...), or None when there is no such process. The command name in the
    parentheses may hold spaces and parentheses itself: the fields are read after the last one."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


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
