"""What a restore looked at, and which crash states look the same to it (the explorer's reduction).

A restoring rank reports every path under its checkpoint directory it opens, lists, stats,
renames, removes or creates (`resilience.rank.working_dir.observe_paths`). A restore is a
deterministic function of what it reads: if another crash state answers every one of those
looks as the restored one did (the same bytes in each file looked at, the same kind of entry, the
same names in each directory listed, each ancestor the same), the restore run on it would look
at the same paths in the same order and get the same answers, so it ends the same way. Such a
state is judged with the restored one's restart instead of being restored again
(docs/exploration.md argues it in full, and says what it cannot see).
"""
from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..core.file_comparison import parse_comparison

ABSENT = "-"
DIRECTORY = "d"
FILE = "f"


@dataclass(frozen=True)
class TreeIndex:
    """A disk state as a reader meets it: each file's content digest and size, and the directories."""

    files: Mapping[str, tuple[str, int]]  # path -> (sha256 of its bytes, its size)
    dirs: frozenset[str]

    @classmethod
    def of(cls, files: Mapping[str, bytes], dirs: Iterable[str]) -> "TreeIndex":
        return cls({path: (hashlib.sha256(content).hexdigest(), len(content)) for path, content in files.items()},
                   frozenset(dirs))

    def digest(self) -> str:
        """Identical disk states have the same digest (`state_tree.state_hash`)."""
        digest = hashlib.sha256()
        for path in sorted(self.files):
            digest.update(f"f {path} {self.files[path][0]}\n".encode())
        for directory in sorted(self.dirs):
            digest.update(f"d {directory}\n".encode())
        return digest.hexdigest()

    def answer(self, path: str, level: str) -> str:
        """What a look at ``path`` sees: whether it is a directory (dir), its kind, its kind and size
        (stat), or its bytes (read)."""
        kind = DIRECTORY if path in self.dirs or path == "." else FILE if path in self.files else ABSENT
        if level == "dir":
            return "dir" if kind == DIRECTORY else "not a dir"
        if kind != FILE:
            return kind
        digest, size = self.files[path]
        return {"kind": FILE, "stat": f"{FILE} {size}"}.get(level, digest)

    def compared(self, path: str, size: int, sha256: str) -> str:
        """What a comparison of ``path`` with the file of ``size`` bytes and ``sha256`` sees
        (`resilience.core.file_comparison`): not a file (its kind), another size, other bytes, the same."""
        if path not in self.files:
            return self.answer(path, "kind")
        digest, found = self.files[path]
        return "other size" if found != size else ("other bytes" if digest != sha256 else "same")

    def names(self, directory: str) -> tuple[str, ...]:
        """The entries directly inside ``directory``."""
        found = {posixpath.basename(p) for p in (*self.files, *self.dirs) if p != "." and _parent(p) == directory}
        return tuple(sorted(found))

    def below(self, directory: str) -> tuple[tuple[str, str], ...]:
        """Every entry under ``directory``, at any depth, with its content."""
        prefix = "" if directory == "." else directory + "/"
        return tuple(sorted((p, self.answer(p, "read")) for p in (*self.files, *self.dirs)
                            if p != "." and p.startswith(prefix)))


LEVELS = ("dir", "kind", "stat", "read")  # what a look at one path depends on, least first
REPLACED = "replaced"  # not a look: from here on the path holds what the restore wrote


@dataclass(frozen=True)
class Observed:
    """The looks of one restore (every rank's), and the answers a state gives to them."""

    entries: tuple[tuple[str, str], ...]  # (path, level): each path looked at, each ancestor's kind
    listings: tuple[str, ...]  # directories whose names it read (os.listdir; a changed directory)
    scans: tuple[str, ...]  # directories it scanned (os.scandir, glob, os.walk): names and kinds (an entry's
    # stat() is a stat look of its own)
    trees: tuple[str, ...]  # directories it removed whole (shutil.rmtree): everything under them
    compared: tuple[tuple[str, int, str], ...] = ()  # (path, size, sha256): files only compared with these

    @classmethod
    def of(cls, looks: Iterable[tuple[str, str]]) -> "Observed":
        """``looks``: (path relative to the checkpoint directory, how) as the ranks reported them
        (`resilience.rank.working_dir.OBSERVED_HOW`), in the order they were made (by the clock,
        every rank's together). A look at a path after some rank replaced it (``replaced``: a
        truncating or creating open) meets what the restore wrote there, not the crash state:
        it is not one."""
        levels: dict[str, int] = {}
        listings, scans, trees, compared, replaced = set(), set(), set(), set(), set()

        def need(path: str, level: str) -> None:
            levels[path] = max(levels.get(path, 0), LEVELS.index(level))

        for path, how in looks:
            path = posixpath.normpath(path)
            if path in replaced:
                continue
            if how == REPLACED:  # its kind was reported with it
                replaced.add(path)
                continue
            for ancestor in _ancestors(path):
                need(ancestor, "kind")
            if (known := parse_comparison(how)) is not None:
                compared.add((path, *known))
                continue
            if how in ("list", "scan", "tree", "change"):
                {"list": listings, "change": listings, "scan": scans, "tree": trees}[how].add(path)
            need(path, {"list": "kind", "scan": "kind", "tree": "kind", "change": "read"}.get(how, how))
        return cls(tuple(sorted((path, LEVELS[level]) for path, level in levels.items())), tuple(sorted(listings)),
                   tuple(sorted(scans)), tuple(sorted(trees)), tuple(sorted(compared)))

    def answers(self, state: TreeIndex) -> tuple:
        """What ``state`` answers to every look: equal answers, the same restore."""
        return (tuple(state.answer(path, level) for path, level in self.entries),
                tuple(state.names(d) for d in self.listings),
                tuple(tuple((n, state.answer(_join(d, n), "kind")) for n in state.names(d)) for d in self.scans),
                tuple(state.below(d) for d in self.trees),
                tuple(state.compared(*look) for look in self.compared))


def _parent(path: str) -> str:
    return posixpath.dirname(path) or "."


def _join(directory: str, name: str) -> str:
    return name if directory == "." else f"{directory}/{name}"


def _ancestors(path: str) -> list[str]:
    found = []
    while path not in (".", ""):
        path = _parent(path)
        found.append(path)
    return found
