"""The uninterrupted reference run, computed once per distinct workload and topology.

Entries live in a cache directory shared by every case and every pytest-xdist worker; a lock file
per key makes concurrent misses run the reference once. The key covers the workload spec, the world
size, whether trusted snapshots are kept, the collective timeout, the torch version and the source
of the modules that define the run, so editing the workload invalidates its entries.
"""
from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from . import janitor, plugins
from .scenario import Case

FORMAT_VERSION = 1
COMPLETE_MARKER = "complete"


def default_cache_dir() -> Path:
    if os.environ.get("RESILIENCE_CACHE"):
        return Path(os.environ["RESILIENCE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "resilience" / "references"


def reference_key(case: Case, with_snapshots: bool) -> str:
    import torch

    from . import worker, workload
    from .device import machine_placement

    strategy = plugins.resolve("strategy", case.strategy.name)
    trainer = strategy.trainer(case.strategy.options)
    trained_by = (worker, workload, plugins.resolve("workload", case.workload.model)) + (
        strategy.trained_by(case.strategy.options) if trainer else ())
    sources = {inspect.getsourcefile(m) for m in trained_by}
    digest = hashlib.sha256()
    for path in sorted(s for s in sources if s):
        digest.update(Path(path).read_bytes())
    identity = {
        "format": FORMAT_VERSION, "torch": torch.__version__, "sources": digest.hexdigest(),
        "workload": asdict(case.workload), "snapshots": with_snapshots, "trainer": trainer,
        "collective_timeout_s": case.timeouts.collective_s,
        "parallel": case.placement.parallel,  # placement and storage do not change the numbers
        "placement": machine_placement(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


class ReferenceCache:
    """Directories built once per key and shared by concurrent harnesses (reference runs, and the
    packages a restart layers over this environment)."""

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
