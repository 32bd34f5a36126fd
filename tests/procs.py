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


def pids_naming(marker: Path) -> list[int]:
    """Processes whose command line names ``marker`` (a case or cluster directory lives under it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(marker) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
