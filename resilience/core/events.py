"""What ranks leave behind: their JSON-lines event files (written by `EventLog`, read whole by
`read_events`, followed while they grow by `EventFollower`) and the tails of their logs."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

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


class EventFollower:
    """Every event some growing event files hold so far, for a supervisor that polls them five
    times a second: each call parses only the lines appended since the previous one (a long first
    run's files hold thousands of events; re-reading them all cost about 8 ms a poll at 1600
    steps). ``paths`` names the files on each call (files may appear later); a file only grows,
    and a line still being written is read once its newline is there."""

    def __init__(self, paths: Callable[[], Iterable[Path]]):
        self._paths = paths
        self._offsets: dict[Path, int] = {}
        self.events: list[dict] = []

    def __call__(self) -> list[dict]:
        for path in self._paths():
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk.rfind(b"\n") + 1
            for line in chunk[:complete].decode("utf-8", errors="replace").splitlines():
                try:
                    self.events.append(json.loads(line))
                except json.JSONDecodeError:  # as in read_events
                    continue
            self._offsets[path] = offset + complete
        return self.events


def tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ("" when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
