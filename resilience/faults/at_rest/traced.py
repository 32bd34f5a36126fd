"""The rank side of fault targets named by behaviour (`resilience.disk.trace_targets`): every rank
traces its saves up to the trigger step, and, for ``@pointer``, the restart's ranks note the first
file each reads.

Call order, in every first-run rank: ``arm(env)`` (opens the rank's trace, hooks renames and
deletes), ``record_open`` from the fault's ``on_open`` while ``recording()``, ``flush()`` when a
save returned, before the ranks meet; then, on the trigger rank, ``files_of(rank)``. In every
restarted rank (``@pointer``): ``first_read(relative, path)`` from the fault's ``on_open_read``.
"""
from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any, Callable

from ...core.events import ClockPhase
from ...disk.interception import STAGING_PREFIX
from ...disk.io_trace import NamespaceHooks, TraceWriter
from ...disk.trace_targets import (
    TRACE_DIR,
    TraceTarget,
    is_selector,
    parse_target,
    pointer_text,
    rank_files,
    saved_steps,
    stale_text,
    top_directories,
)

DECISION = "pointer.json"  # the restart's decision: which file is the pointer, what it said


class SaveTracer:
    """One rank's trace of its saves up to ``step``, and what the traces say about the files."""

    def __init__(self, target: TraceTarget, step: int):
        self.target, self.step = target, step
        self.env: Any = None
        self.writer: TraceWriter | None = None
        self.hooks: NamespaceHooks | None = None

    @classmethod
    def for_values(cls, values: tuple[Any, ...], step: int, world_size: int) -> "SaveTracer | None":
        """A tracer when any of ``values`` (``file``, ``source``) is a selector."""
        selectors = [parse_target(v, world_size) for v in values if is_selector(v)]
        return cls(selectors[0], step) if selectors else None

    @property
    def directory(self) -> Path:
        return self.env.case_dir / TRACE_DIR

    def arm(self, env: Any) -> None:
        self.env = env
        if env.incarnation != "first_run":
            return
        self.writer = TraceWriter(self.directory, env.rank)
        self.hooks = NamespaceHooks(env.checkpoint_dir, self._namespace_op)
        self.hooks.install()

    def recording(self) -> bool:
        clock = self.env.clock
        return self.writer is not None and clock.phase == ClockPhase.SAVE and clock.save_step <= self.step

    def _namespace_op(self, kind: str, **fields: Any) -> None:
        if self.recording() and kind in ("rename", "unlink"):
            self.writer.record(self.env.clock.save_step, kind, **fields)

    def wants(self, relative: str) -> bool:
        return self.recording()

    def record_open(self, relative: str) -> None:
        if self.recording():
            self.writer.record(self.env.clock.save_step, "open", path=relative)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def files_of(self, rank: int, step: int | None = None) -> list[str]:
        """The files ``rank`` wrote during the save of ``step`` (the trigger's) that exist now."""
        files = rank_files(self.directory, rank, self.step if step is None else step)
        return [f for f in files if (self.env.checkpoint_dir / f).is_file()]

    def resolve(self, value: str) -> list[str]:
        """The files a ``@written_by:R`` selector names now (none for ``@pointer``: it is found at restore)."""
        target = parse_target(value, self.env.world_size)
        return self.files_of(target.rank) if target.kind == "written_by" else []

    # -- @pointer, in the restart ---------------------------------------------------------------
    def first_read(self, relative: str, path: Path, rewrite: Callable[[Path, str, str], None],
                   missing: bool = False) -> dict | None:
        """This rank's first read at restore is ``relative``. Under a lock shared by the ranks: the
        first rank to read a file that the trigger step's save wrote and whose text names that save
        decides it is the pointer and has ``rewrite(path, old, new)`` set it one save back; returns
        that decision when this call made it, else None. ``missing``: to a save that does not exist."""
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "pointer.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            (directory / f"first_read_rank{self.env.rank}").write_text(relative)
            decision_path = directory / DECISION
            if decision_path.exists():
                return None
            decision = self._decide(relative, path, missing)
            decision_path.write_text(json.dumps(decision))
            if decision.get("new") is None:
                return None
            rewrite(path, decision["old"], decision["new"])
            return decision

    def _decide(self, relative: str, path: Path, missing: bool) -> dict:
        world = self.env.world_size
        steps = [s for s in saved_steps(self.directory, world) if s <= self.step]
        newest = sorted({f for r in range(world) for f in rank_files(self.directory, r, self.step)})
        if relative.startswith(STAGING_PREFIX) or relative not in newest or len(steps) < 2:
            return {"file": relative, "why": f"not rewritten by the step-{self.step} save, or no earlier save"}
        older = steps[-2]
        text = pointer_text(path)
        if text is None:
            return {"file": relative, "why": "not a small text file"}
        previous = top_directories(sorted({f for r in range(world) for f in rank_files(self.directory, r, older)}))
        if missing:  # a tag whose directory does not exist, or a step never saved
            older, previous = 10 ** 8 - 1, {d + "-missing" for d in top_directories(newest)}
        new = stale_text(text, self.step, older, top_directories(newest), previous)
        if new is None:
            return {"file": relative, "why": f"its text names neither the step-{self.step} save's directory nor step"}
        return {"file": relative, "old": text, "new": new, "older_step": older}
