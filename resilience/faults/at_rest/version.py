"""A checkpoint that claims another version of what wrote it: an upgrade or a downgrade of the
framework between save and restore (the seed: "version upgrades may make checkpoints incompatible").

On every rank, right after its save for ``step`` returned, the strategy rewrites the version
stamp its files carry (its format version, DeepSpeed's ``ds_version``, ...) to an ``older`` or
``newer`` one. A strategy that cannot (no `Capability.VERSION_STAMP`) is read by behaviour instead:
each rank rewrites every version field (a key naming a version, at the top of a saved mapping or
one level down) in the torch files it wrote during that save, as its IO trace shows them. The
scenario states whether the restore refuses (loud) or loads and recovers. A real cross-version
restore runs the restart under other packages instead (``restart.packages``).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from ...core.capabilities import Capability
from ...core.events import Event
from ...disk.trace_targets import TraceTarget
from ..base import Fault, WriteListener
from .traced import SaveTracer

CLAIMS = ("older", "newer")


class VersionMismatch(Fault, WriteListener):
    kind = "version_mismatch"
    points = {"save": ("returned",)}
    byte_points = ()
    params = {"version": (CLAIMS, "older")}

    def __init__(self, spec):
        super().__init__(spec)
        self.tracer = SaveTracer(TraceTarget("written_by"), spec.trigger.step)
        self.self_stamping = True

    def attach(self, strategy) -> None:
        # as configured on this rank (a wrapper: what it forwards of its inner strategy's)
        self.self_stamping = strategy.offers(Capability.VERSION_STAMP)
        if not self.self_stamping:
            self.tracer.arm(self.env)

    def wants(self, relative: str) -> bool:  # interception is installed before the strategy exists
        return not self.self_stamping and self.tracer.wants(relative)

    def on_open(self, file) -> None:
        if not self.self_stamping:
            self.tracer.record_open(file.relative)

    def after_save(self, strategy, step: int) -> None:
        """Every rank restamps its own files of the trigger step's checkpoint; once all have, the
        trigger rank dies (the job stops there, as it does for an upgrade), so the restart
        resumes from exactly that checkpoint. No version field anywhere: the fault says so and
        lets the job run on."""
        if step != self.trigger.step:
            return
        import torch
        import torch.distributed as dist

        claim = self.spec.params["version"]
        if self.self_stamping:
            files = strategy.rewrite_version_stamp(step, claim)
        else:
            self.tracer.flush()
            files = restamp_fields(self.env.checkpoint_dir, self.tracer.files_of(self.env.rank), claim)
        count = torch.tensor([len(files)])
        dist.all_reduce(count)
        if not int(count):
            if self.on_trigger_rank():
                self.env.emit(Event.FAULT_MISSED, kind=self.kind, reason=f"no file of the step-{step} save carries a "
                              "version field (a key naming a version in a saved mapping) and the strategy "
                              "rewrites no version stamp")
            return
        stops = self.on_trigger_rank()
        self.fired(point="returned", files=files, claim=claim, ends_process=stops)
        dist.barrier()
        if stops:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # SIGKILL is not deliverable late; this only keeps the code honest


def claimed(value: Any, claim: str) -> Any:
    """``value`` (a version number or string) as an ``older`` or ``newer`` release would write it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value + 1000 if claim == "newer" else max(value - 1, 0)
    if isinstance(value, str):
        return "999.0.0" if claim == "newer" else "0.0.1"
    return value


def restamp_fields(root: Path, relatives: list[str], claim: str) -> list[str]:
    """Every version field of the torch files among ``relatives`` changed to ``claim``; the files changed."""
    import torch

    changed = []
    for relative in relatives:
        path = root / relative
        with open(path, "rb") as file:
            if file.read(4) != b"PK\x03\x04":  # not a torch zip file: a marker, a pointer
                continue
        state = torch.load(path, weights_only=True)
        if not isinstance(state, dict) or not _restamp(state, claim, depth=2):
            continue
        torch.save(state, path)
        changed.append(relative)
    return changed


def _restamp(mapping: dict, claim: str, depth: int) -> bool:
    found = False
    for key, value in list(mapping.items()):
        if isinstance(key, str) and "version" in key.lower() and isinstance(value, (int, str)):
            mapping[key] = claimed(value, claim)
            found = found or mapping[key] != value
        elif isinstance(value, dict) and depth > 1:
            found = _restamp(value, claim, depth - 1) or found
    return found
