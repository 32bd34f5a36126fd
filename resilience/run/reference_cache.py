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
from ..core.directory_cache import DirectoryCache
from ..core.case import Case

FORMAT_VERSION = 1


def default_cache_dir() -> Path:
    if os.environ.get("RESILIENCE_CACHE"):
        return Path(os.environ["RESILIENCE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "resilience" / "references"


def reference_key(case: Case, with_snapshots: bool) -> str:
    import torch

    from ..rank import worker
    from ..workloads import mlp as workload
    from ..core.device import machine_placement

    strategy = registry.resolve("strategy", case.strategy.name)
    trainer = strategy.trainer(case.strategy.options)
    trained_by = (worker, workload, registry.resolve("workload", case.workload.model)) + (
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


class ReferenceCache(DirectoryCache):
    """The reference runs: one directory per `reference_key`, shared by every case and every
    pytest-xdist worker."""
