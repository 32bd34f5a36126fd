"""Every crash state of one traced save under a bounded crash model, each distinct disk state once.

`crash_states.CrashModel` says what a power cut *can* leave; a torn write can keep any prefix of its
bytes and a lost writeback can hole any block, so the full space is far too large to restore. The
bounded model below picks, per file, the fates that tell a reader apart, and enumerates every
combination of them at every op boundary (docs/exploration.md, "the bounded crash model"):

- the instant: every boundary of `CrashModel.boundaries` (each rank caught at its own op);
- the namespace: every prefix of the uncommitted namespace ops (0, 1, ... of them lost from the end);
- file data written since the file's last fsync, per file: kept, dropped, torn (only the first 0
  bytes, or the first half, of the unsynced bytes reached the disk), or holed (the size reached the
  disk but one 4 KiB block reads as zeros: the first, the middle or the last block of the file);
- combinations: at most ``lossy_files`` files are torn or holed at once while the other files keep
  their data; besides, every unsynced file drops its data together (the sweep's "all lost").

Identical disk states (same bytes, same directories) are kept once: most points coincide.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from .crash_states import BLOCK, CrashModel, CrashPoint, Loss
from .observed import TreeIndex


@dataclass(frozen=True)
class Bounds:
    """The bounds of the enumerated model (module docstring)."""

    lossy_files: int = 1  # files torn or holed at once; the others keep their unsynced data
    tears: tuple[float, ...] = (0.0, 0.5)  # torn: the fraction of the unsynced bytes that reached the disk
    holes: tuple[str, ...] = ("first", "middle", "last")  # holed: which 4 KiB block reads as zeros
    max_points: int = 50_000  # crash points at most before the save counts as too large to enumerate


@dataclass(frozen=True)
class DistinctState:
    """One distinct disk state: its content hash and, for each set of ranks whose save had returned
    at the cut (judged apart), the first crash point in enumeration order (simplest first)."""

    digest: str
    points: tuple[CrashPoint, ...]
    index: TreeIndex  # the state as a reader meets it (the explorer's reduction)


@dataclass(frozen=True)
class Enumeration:
    """The distinct states of a save, or why there is no full list (``states`` empty then)."""

    states: tuple[DistinctState, ...]
    points: int  # crash points of the bounded model
    too_large: str = ""  # why the save was not enumerated (the fallback search covers it)

    @property
    def complete(self) -> bool:
        return not self.too_large


def fates(path: str, unsynced: int, size: int, bounds: Bounds) -> list[Loss]:
    """The fates of one file's unsynced data under ``bounds`` but keeping it: dropped, torn, holed."""
    losses = [Loss(path, "drop")]
    for fraction in bounds.tears:
        keep = int(unsynced * fraction)
        if keep < unsynced:
            losses.append(Loss(path, "prefix", keep_bytes=keep))
    blocks = (size + BLOCK - 1) // BLOCK
    chosen = {"first": 0, "middle": blocks // 2, "last": blocks - 1}
    for block in sorted({chosen[name] for name in bounds.holes} if blocks else ()):
        losses.append(Loss(path, "zeros", zero_from=block * BLOCK, zero_to=min(size, (block + 1) * BLOCK)))
    return losses


def points(model: CrashModel, bounds: Bounds) -> Iterator[CrashPoint]:
    """Every crash point of the bounded model, simplest first at each instant."""
    for count in model.boundaries():
        cuts = model.cuts_at(count)
        volatile = model.volatile(cuts)
        per_file = [fates(path, unsynced, size, bounds) for path, unsynced, size in volatile.dirty]
        combos: list[tuple[Loss, ...]] = [()]
        for width in range(1, bounds.lossy_files + 1):
            for files in itertools.combinations(per_file, width):
                combos.extend(itertools.product(*files))
        if len(volatile.dirty) > bounds.lossy_files:  # every file's data lost together
            combos.append(tuple(Loss(path, "drop") for path, _, _ in volatile.dirty))
        for lost_metadata in range(len(volatile.metadata) + 1):
            for losses in combos:
                yield CrashPoint(cuts=cuts, lost_metadata=lost_metadata, losses=losses)


def count_points(model: CrashModel, bounds: Bounds) -> int:
    """How many crash points `points` yields, without building the disk states."""
    total = 0
    for count in model.boundaries():
        volatile = model.volatile(model.cuts_at(count))
        sizes = [len(fates(path, unsynced, size, bounds)) for path, unsynced, size in volatile.dirty]
        combos = 1 + sum(_product(files) for width in range(1, bounds.lossy_files + 1)
                         for files in itertools.combinations(sizes, width))
        combos += 1 if len(sizes) > bounds.lossy_files else 0
        total += (len(volatile.metadata) + 1) * combos
    return total


def distinct_states(model: CrashModel, limit: int, bounds: Bounds = Bounds()) -> Enumeration:
    """Every distinct disk state of the bounded model, in enumeration order; none once there are
    more than ``limit`` (the enumeration stops there)."""
    total = count_points(model, bounds)
    if total > bounds.max_points:
        return Enumeration(states=(), points=total,
                           too_large=f"{total} crash points under the bounded model, over {bounds.max_points}")
    seen: dict[str, dict[frozenset[int], CrashPoint]] = {}
    indexes: dict[str, TreeIndex] = {}
    for count, point in enumerate(points(model, bounds)):
        index = TreeIndex.of(*model.disk(point))
        digest = index.digest()
        if digest not in seen:
            if len(seen) == limit:
                return Enumeration(states=(), points=total, too_large=(
                    f"more than {limit} distinct disk states (the first {limit + 1} within {count + 1} of "
                    f"its {total} crash points)"))
            seen[digest], indexes[digest] = {}, index
        seen[digest].setdefault(model.returned(point), point)
    return Enumeration(states=tuple(DistinctState(digest, tuple(by_returned.values()), indexes[digest])
                                    for digest, by_returned in seen.items()), points=total)


def _product(values) -> int:
    result = 1
    for value in values:
        result *= value
    return result
