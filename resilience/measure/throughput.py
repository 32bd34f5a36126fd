"""A strategy's save and restore throughput on the checkpoint filesystem, through a real no-fault case.

The case trains a larger model than the scenarios do (``size``), saves it twice with the strategy
under test, restarts and restores the newest checkpoint, all in real rank processes on the same
filesystem the raw probe measured. Bytes per checkpoint are what the strategy left on disk divided
by the number of saves. On an object store (``object_store``) the case checkpoints into the store
the probe measured, its bytes are what the bucket held under the case's prefix at its end, and
the restore is compared with the probe's GET where a disk's is compared with its write.
"""
from __future__ import annotations

import shutil
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.case import VerdictKind
from ..core.records import CaseResult
from ..run.harness import Harness
from ..scenario.loader import load_document

STEPS, CHECKPOINT_EVERY = 4, 2


@dataclass(frozen=True)
class StrategyThroughput:
    """One strategy's save and restore on the checkpoint filesystem, next to the raw probe."""

    strategy: str
    world_size: int
    bytes_per_checkpoint: int
    save_s: float  # median over the checkpoints of one run: first rank begins .. last rank returns
    restore_s: float  # the restart's strategy.load, slowest rank
    raw_bytes_per_s: float  # the probe's write (a directory) or PUT (an object store)
    verdict: str
    raw_read_bytes_per_s: float | None = None  # an object store: the probe's GET, for the restore

    @property
    def save_bytes_per_s(self) -> float:
        return self.bytes_per_checkpoint / self.save_s if self.save_s > 0 else 0.0

    @property
    def restore_bytes_per_s(self) -> float:
        return self.bytes_per_checkpoint / self.restore_s if self.restore_s > 0 else 0.0

    @property
    def save_fraction(self) -> float:
        return self.save_bytes_per_s / self.raw_bytes_per_s if self.raw_bytes_per_s else 0.0

    @property
    def restore_fraction(self) -> float:
        raw = self.raw_bytes_per_s if self.raw_read_bytes_per_s is None else self.raw_read_bytes_per_s
        return self.restore_bytes_per_s / raw if raw else 0.0


def throughput_case(name: str, options: Mapping[str, Any], size_bytes: int, world_size: int,
                    object_store: str | None = None):
    document = {**({"object_store": object_store} if object_store else {}),
        "name": f"throughput of {name}",
        "description": "a larger no-fault case whose saves and restore are timed",
        "strategy": {"name": name, "options": dict(options)},
        "workload": {"model": "mlp", "world_size": world_size, "steps": STEPS, "checkpoint_every": CHECKPOINT_EVERY,
                     "global_batch": 4 * world_size, "size": size_bytes},
        "fault": {"kind": "none"},
        "restart": {"world_size": world_size},
        "expect": "recovers",
        "timeouts": {"phase": 600, "collective": 300},
    }
    return load_document(document, f"<throughput {name}>").cases[0]


def checkpoint_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_symlink())


def figures_of(result: CaseResult, label: str, raw_bytes_per_s: float, total_bytes: int,
               raw_read_bytes_per_s: float | None = None) -> StrategyThroughput:
    saves = result.save_s
    return StrategyThroughput(
        strategy=label, world_size=result.case.workload.world_size,
        bytes_per_checkpoint=total_bytes // max(1, len(result.case.workload.checkpoint_steps)),
        save_s=statistics.median(saves.values()) if saves else 0.0, restore_s=result.restore_s or 0.0,
        raw_bytes_per_s=raw_bytes_per_s, verdict=result.verdict.kind.value, raw_read_bytes_per_s=raw_read_bytes_per_s)


def stored_bytes(work_dir: Path) -> int:
    """What the case's object store held under its prefix at the case's end (``S3Store.record_contents``)."""
    import json

    return json.loads((work_dir / "s3_objects.end.json").read_text())["bytes"]


def measure(harness: Harness, name: str, options: Mapping[str, Any], label: str, size_bytes: int,
            world_size: int, raw_bytes_per_s: float, raw_read_bytes_per_s: float | None = None,
            object_store: str | None = None) -> StrategyThroughput:
    """Run the throughput case with ``harness`` (which must keep work directories: the bytes are
    counted afterwards) and remove its directory. ``object_store``: the case checkpoints into the
    harness's object store, whose GET figure is ``raw_read_bytes_per_s``."""
    case = throughput_case(name, options, size_bytes, world_size, object_store)
    result = harness.run(case)
    try:
        total = stored_bytes(result.work_dir) if object_store else checkpoint_bytes(result.work_dir / "checkpoints")
    finally:
        shutil.rmtree(result.work_dir, ignore_errors=True)
    figure = figures_of(result, label, raw_bytes_per_s, total, raw_read_bytes_per_s)
    if result.verdict.kind is not VerdictKind.RECOVERED:
        raise RuntimeError(f"the throughput case of {label} gave {figure.verdict}: "
                           + "; ".join(result.verdict.findings[:3]))
    return figure
