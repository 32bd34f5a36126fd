"""A crash state as a real directory tree: written out for real ranks to restore from, read back,
hashed so that identical states are restored once, removed."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .observed import TreeIndex


def materialise(files: dict[str, bytes], dirs: set[str], target: Path) -> None:
    """Write a disk state as a real directory tree at ``target`` (which must not exist)."""
    target.mkdir(parents=True)
    for directory in sorted(dirs):
        (target / directory).mkdir(parents=True, exist_ok=True)
    for path, content in files.items():
        destination = target / path
        destination.parent.mkdir(parents=True, exist_ok=True)  # a name whose directory entry was lost
        destination.write_bytes(content)


def state_hash(files: dict[str, bytes], dirs: set[str]) -> str:
    """Identical disk states have the same hash: each is restored once."""
    return TreeIndex.of(files, dirs).digest()


def read_tree(root: Path) -> tuple[dict[str, bytes], set[str]]:
    """The files and directories under ``root`` as `CrashModel.disk` gives them."""
    files, dirs = {}, {"."}
    for current, subdirs, names in os.walk(root):
        relative = os.path.relpath(current, root).replace(os.sep, "/")
        for name in subdirs:
            dirs.add(name if relative == "." else f"{relative}/{name}")
        for name in names:
            path = name if relative == "." else f"{relative}/{name}"
            files[path] = (Path(current) / name).read_bytes()
    return files, dirs


def remove_tree(path: Path) -> None:
    """Remove a materialised state (what is already gone is no error)."""
    shutil.rmtree(path, ignore_errors=True)
