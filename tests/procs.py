"""Process-tree helpers for tests (standard library only: test_hygiene imports no torch)."""
from __future__ import annotations

from pathlib import Path


def child_pids(pid: int) -> list[int]:
    """The live children of process ``pid``, from every one of its threads."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return found
