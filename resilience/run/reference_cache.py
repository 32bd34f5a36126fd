"""The uninterrupted reference run, computed once per distinct workload and topology.

Entries live in a cache directory shared by every case and every pytest-xdist worker; a lock file
per key makes concurrent misses run the reference once. The key covers the workload spec, the world
size, whether trusted snapshots are kept, the collective timeout, the torch version and the source
of the modules that define the run, so editing the workload invalidates its entries.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import asdict
from pathlib import Path

from ..core import registry
from ..core.case import Case
from ..core.directory_cache import DirectoryCache
from ..core.paths import PROJECT_ROOT

FORMAT_VERSION = 1


def default_cache_dir() -> Path:
    if os.environ.get("RESILIENCE_CACHE"):
        return Path(os.environ["RESILIENCE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "resilience" / "references"


# Everything a reference rank runs: its entry and hooks, the workload, the strategy that trains,
# the faults' rank side, and what those import below them. Not the scenario validator: a rank
# receives the validated case (`Case.read`), so rewording an error message re-runs no reference.
RANK_CODE = ("errors.py", "core", "disk", "objectstore", "workloads", "strategies", "faults", "rank")


def rank_sources() -> list[Path]:
    """The source files of every module of this package that runs inside a rank."""
    package = PROJECT_ROOT / "resilience"
    found = []
    for entry in RANK_CODE:
        path = package / entry
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return found


def reference_key(case: Case, with_snapshots: bool) -> str:
    """The cache key of the case's reference run: it changes with anything that could change the
    numbers: the workload spec, the topology's parallel layout, torch, the case's software, the
    machine's placement, and the source of every module a rank runs (this package's and the plug-ins' own, which may
    live outside it)."""
    import torch

    from ..core.device import machine_placement

    strategy = registry.resolve("strategy", case.strategy.name)
    trainer = strategy.trainer(case.strategy.options)
    plugins = (registry.resolve("workload", case.workload.model), strategy) + (
        strategy.trained_by(case.strategy.options) if trainer else ())
    sources = {Path(p).resolve() for p in rank_sources()} | {
        Path(p).resolve() for p in map(inspect.getsourcefile, plugins) if p}
    digest = hashlib.sha256()
    for path in sorted(sources):
        digest.update(str(path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path).encode())
        digest.update(path.read_bytes())
    identity = {
        "format": FORMAT_VERSION, "torch": torch.__version__, "sources": digest.hexdigest(),
        "workload": asdict(case.workload), "snapshots": with_snapshots, "trainer": trainer,
        "collective_timeout_s": case.timeouts.collective_s,
        "parallel": case.placement.parallel,  # placement and storage do not change the numbers
        # the releases layered in (an interpreter by its path: its environment is not read)
        "software": case.software.as_dict(),
        "placement": machine_placement(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


class ReferenceCache(DirectoryCache):
    """The reference runs: one directory per `reference_key`, shared by every case and every
    pytest-xdist worker."""
