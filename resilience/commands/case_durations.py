"""How long each case took in the last run that ran it, so that the next run starts the longest cases
first: under pytest-xdist a long case that starts last keeps one worker busy while the others have
finished. The pytest plugin records every case's setup, call and teardown seconds in the run's
controller and writes them at the session's end into the reference cache's directory
(``durations.json``, beside the cached runs);
at collection the controller reads the file once and hands it to every xdist worker, so each orders
the same cases the same way, as xdist requires.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

FILE_NAME = "durations.json"
Item = TypeVar("Item")


def durations_path(cache_dir: Path) -> Path:
    """The durations file of the runs whose reference cache is ``cache_dir``."""
    return Path(cache_dir) / FILE_NAME


def read(path: Path) -> dict[str, float]:
    """Seconds per case id (pytest's node id) from ``path``; none when it is missing or unreadable
    (a file another run is replacing is read whole or not at all: it is renamed into place)."""
    try:
        recorded = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(recorded, dict):
        return {}
    return {key: float(value) for key, value in recorded.items() if isinstance(value, (int, float))}


def write(path: Path, measured: dict[str, float]) -> None:
    """Add ``measured`` to what ``path`` holds (a case not run this time keeps its last duration)
    and replace the file in one rename."""
    if not measured:
        return
    merged = {**read(path), **measured}
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE_NAME}.")
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump(dict(sorted(merged.items())), file, indent=0)
        os.replace(staging, path)
    except BaseException:
        os.unlink(staging)
        raise


def longest_first(items: Sequence[Item], durations: dict[str, float], key: Callable[[Item], str | None]) -> list[Item]:
    """``items`` with those ``key`` names (a case id; None: not a case, left where it is) reordered
    among their own places: never seen first, in their order, then the longest recorded first."""
    places = [index for index, item in enumerate(items) if key(item) is not None]
    cases = [items[index] for index in places]
    unseen = [item for item in cases if key(item) not in durations]
    seen = sorted((item for item in cases if key(item) in durations), key=lambda item: -durations[key(item)])
    ordered = list(items)
    for index, item in zip(places, unseen + seen, strict=True):
        ordered[index] = item
    return ordered
