"""Directories built once per key and shared by concurrent processes: a lock file per key makes
concurrent misses build an entry once, and an entry appears only when complete."""
from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from . import janitor

COMPLETE_MARKER = "complete"


class DirectoryCache:
    """Directories built once per key under ``root`` (reference runs; the packages a restart
    layers over this environment)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def entry(self, key: str, produce: Callable[[Path], None]) -> Path:
        """The directory of a complete entry for ``key``. On a miss ``produce(directory)`` fills a
        fresh directory, or raises (nothing is cached then, and the next run tries again)."""
        final = self.root / key
        if (final / COMPLETE_MARKER).exists():
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if we die
            if (final / COMPLETE_MARKER).exists():
                return final
            building = self.root / f"{key}.building-{os.getpid()}"
            shutil.rmtree(building, ignore_errors=True)
            building.mkdir()
            janitor.register("dir", building)  # a process killed mid-build leaves no half entry
            try:
                produce(building)
                (building / COMPLETE_MARKER).write_text("")
                shutil.rmtree(final, ignore_errors=True)
                os.rename(building, final)
                return final
            except BaseException:
                shutil.rmtree(building, ignore_errors=True)
                raise
            finally:
                janitor.release("dir", building)
