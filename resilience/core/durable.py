"""Writing a small file so that a crash, a power cut or a concurrent writer never leaves it torn:
the one implementation, used by the strategies' pointers and manifests and by the elastic
layout's records alike."""
from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(path: Path) -> None:
    """Make the entries of directory ``path`` (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """Temp file, fsync, rename, directory fsync: after a crash ``path`` is old or new, never torn.
    The temp file is named by the process, so that several ranks writing the same file (the
    same content) never write into one another's."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(staging, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(staging, path)
    fsync_directory(path.parent)
