"""What ranks leave behind: their JSON-lines event files (written by `EventLog`, read by
`read_events`) and the tails of their logs."""
from __future__ import annotations

import json
import os
import time
from typing import Any
from pathlib import Path

LOG_TAIL_CHARS = 3000


class EventLog:
    """Append-only JSON lines, flushed per event so a SIGKILL loses nothing already emitted."""

    def __init__(self, path: Path, rank: int):
        self.rank = rank
        self._file = open(path, "a", buffering=1, encoding="utf-8")

    def emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, "rank": self.rank, "pid": os.getpid(), "time": time.time(), **fields}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> list[dict]:
    """Every event in ``path``, in order; none when it does not exist. The last line of a killed
    rank may be cut: it is skipped."""
    events = []
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return events
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ("" when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
