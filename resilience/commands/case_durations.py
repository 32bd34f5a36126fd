"""How long each case took in the last run that ran it, and how much CPU it used, so that the next
run starts the longest cases first (under pytest-xdist a long case that starts last keeps one worker
busy while the others have finished) and keeps the cases that mostly wait apart (two of them side by
side leave the machine's cores idle). The pytest plugin records every case's setup, call and
teardown seconds, and the CPU seconds its processes spent, in the run's controller and writes them
at the session's end into the reference cache's directory (``durations.json``, beside the cached
runs); at collection the controller reads the file once and hands it to every xdist worker, so each
orders the same cases the same way, as xdist requires.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

FILE_NAME = "durations.json"
#: a case whose processes kept less than this share of one core busy mostly waits (a stall, a
#: partition, a slow read, a collective timeout): two such side by side leave the cores idle
WAITING_CORES = 0.5
#: how many cases that compute stand between two that mostly wait, where there are enough of them:
#: a worker that runs a waiting case runs it beside the next few the other workers take
WAITING_SPACING = 3
Item = TypeVar("Item")


@dataclass(frozen=True)
class CaseCost:
    """What one case cost in the last run that ran it: wall seconds, and the CPU seconds its
    processes spent (None: not recorded)."""
    seconds: float
    cpu_seconds: float | None = None

    @property
    def mostly_waits(self) -> bool:
        return self.cpu_seconds is not None and self.cpu_seconds < WAITING_CORES * self.seconds


def durations_path(cache_dir: Path) -> Path:
    """The durations file of the runs whose reference cache is ``cache_dir``."""
    return Path(cache_dir) / FILE_NAME


def read(path: Path) -> dict[str, CaseCost]:
    """Each case's cost by its id (pytest's node id) from ``path``; none when it is missing or
    unreadable (a file another run is replacing is read whole or not at all: it is renamed into
    place)."""
    try:
        return from_records(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return {}


def from_records(recorded: object) -> dict[str, CaseCost]:
    """Costs from what `as_records` made (as the file holds it, or as xdist sends it to a worker);
    plain seconds, as older runs wrote them, read as costs without CPU."""
    if not isinstance(recorded, dict):
        return {}
    return {key: cost for key, value in recorded.items() if (cost := _cost(value)) is not None}


def _cost(value: object) -> CaseCost | None:
    if isinstance(value, dict):
        seconds, cpu = value.get("seconds"), value.get("cpu_seconds")
        cpu = float(cpu) if isinstance(cpu, (int, float)) and math.isfinite(cpu) else None
        return CaseCost(float(seconds), cpu) if isinstance(seconds, (int, float)) else None
    return CaseCost(float(value)) if isinstance(value, (int, float)) else None


def as_records(costs: dict[str, CaseCost]) -> dict[str, dict]:
    """``costs`` as plain data, for the file and for xdist's workers."""
    return {key: asdict(cost) for key, cost in sorted(costs.items())}


def write(path: Path, measured: dict[str, CaseCost]) -> None:
    """Add ``measured`` to what ``path`` holds (a case not run this time keeps its last cost) and
    replace the file in one rename."""
    if not measured:
        return
    merged = {**read(path), **measured}
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE_NAME}.")
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump(as_records(merged), file, indent=0)
        os.replace(staging, path)
    except BaseException:
        os.unlink(staging)
        raise


def run_order(items: Sequence[Item], costs: dict[str, CaseCost], key: Callable[[Item], str | None]) -> list[Item]:
    """``items`` with those ``key`` names (a case id; None: not a case, left where it is) reordered
    among their own places: never seen first, in their order, then the longest recorded first, except
    that a case that mostly waits comes after at least `WAITING_SPACING` cases that compute since the
    last one that waits (while such cases remain), so that the other workers compute beside it."""
    places = [index for index, item in enumerate(items) if key(item) is not None]
    cases = [items[index] for index in places]
    unseen = [item for item in cases if key(item) not in costs]
    seen = sorted((item for item in cases if key(item) in costs), key=lambda item: -costs[key(item)].seconds)
    waiting = [item for item in seen if costs[key(item)].mostly_waits]
    computing = [item for item in seen if not costs[key(item)].mostly_waits]
    ordered_cases, since_waiting = list(unseen), WAITING_SPACING
    while waiting or computing:
        longer_waits = waiting and (not computing or
                                    costs[key(waiting[0])].seconds >= costs[key(computing[0])].seconds)
        if longer_waits and (since_waiting >= WAITING_SPACING or not computing):
            ordered_cases.append(waiting.pop(0))
            since_waiting = 0
        else:
            ordered_cases.append(computing.pop(0))
            since_waiting += 1
    ordered = list(items)
    for index, item in zip(places, ordered_cases, strict=True):
        ordered[index] = item
    return ordered
