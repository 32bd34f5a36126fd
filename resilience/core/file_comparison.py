"""A reader that only compares a file with a known one: while ``comparing(path, size, sha256)`` is
open, what the reader does next may depend on one answer about ``path`` alone: missing or not a
file, another size, the same size but other bytes, or the very file. A restore observed for the
explorer's reduction reports that comparison instead of the file's bytes
(`resilience.rank.working_dir`), so crash states that damage a verified file differently look the
same to it (docs/exploration.md says why that is sound)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

COMPARED = "compared"  # the look's kind: "compared <size> <sha256>"

_comparing: dict[str, str] = {}  # absolute path -> the look reported for it while compared


@contextmanager
def comparing(path: os.PathLike | str, size: int, sha256: str) -> Iterator[None]:
    """Inside: every stat and read of ``path`` serves only to tell whether it is the file of
    ``size`` bytes whose SHA-256 is ``sha256`` (hex); the caller must not let anything else of
    what it read (a size, a digest) reach what it does or says."""
    key = os.path.abspath(os.fsdecode(path))
    _comparing[key] = f"{COMPARED} {size} {sha256}"
    try:
        yield
    finally:
        _comparing.pop(key, None)


def comparison_of(path: str) -> str | None:
    """The look a stat or read of the absolute ``path`` is part of, if it is being compared."""
    return _comparing.get(path)


def parse_comparison(how: str) -> tuple[int, str] | None:
    """(size, sha256) of a comparison look, None for any other look."""
    kind, _, rest = how.partition(" ")
    if kind != COMPARED:
        return None
    size, sha256 = rest.split(" ")
    return int(size), sha256
