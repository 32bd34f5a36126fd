"""What the kernel says of a process, read from ``/proc/<pid>/stat``: the one parser."""
from __future__ import annotations

from pathlib import Path


def process_state(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of process ``pid`` (state: ``R``, ``S``, ``T`` stopped, ``Z`` exited
    and not yet reaped, ...), or None when there is no such process. The command name in the
    parentheses may hold spaces and parentheses itself: the fields are read after the last one."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None
