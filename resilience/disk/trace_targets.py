"""Fault targets named by behaviour, resolved from the IO trace of the run itself.

A fault's ``file`` (and ``duplicate_file``'s ``source``) is a glob of names, or one of:

- ``@written_by:R``: the files rank ``R`` wrote during the trigger step's save: every file it
  opened for writing under the checkpoint directory in that save, followed through its renames
  (a temporary file renamed into place is named by its final name), less those it deleted;
- ``@pointer``: the file every rank read first at restore, when it was rewritten by the trigger
  step's save and its text names that save (its directory or its step number): a pointer such as
  DeepSpeed's ``latest``, whatever the strategy calls it.

So a catcher applies to any strategy that writes files, however it names them. The ops come from
the `io_trace` recorder (`TraceWriter`, `NamespaceHooks`) that each rank runs during the saves, one
``trace_rank<R>.jsonl`` per rank under the case's ``target_trace`` directory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .interception import STAGING_PREFIX
from .io_trace import TraceOp, read_trace

WRITTEN_BY, POINTER = "@written_by:", "@pointer"
TRACE_DIR = "target_trace"  # under the case directory
ALLOWED = f"a glob relative to the checkpoint directory, {WRITTEN_BY}R (rank R's files of the save) or {POINTER}"
MAX_POINTER_BYTES = 4096


@dataclass(frozen=True)
class TraceTarget:
    """A parsed selector: ``kind`` "written_by" (with ``rank``) or "pointer"."""

    kind: str
    rank: int = -1

    def describe(self, step: int) -> str:
        if self.kind == "pointer":
            return "the file every rank read first at restore (a pointer naming the step-%d save)" % step
        return f"the files rank {self.rank} wrote during the step-{step} save"


def is_selector(value: object) -> bool:
    return isinstance(value, str) and value.startswith("@")


def parse_target(value: str, world_size: int) -> TraceTarget:
    """The selector ``value`` names; ValueError (with what is allowed) when it names none."""
    if value == POINTER:
        return TraceTarget("pointer")
    if value.startswith(WRITTEN_BY):
        rank = value[len(WRITTEN_BY):]
        if rank.isdigit() and int(rank) < world_size:
            return TraceTarget("written_by", int(rank))
        raise ValueError(f"{WRITTEN_BY}R with R in 0..{world_size - 1} (workload.world_size is {world_size})")
    raise ValueError(ALLOWED)


def files_written(ops: list[TraceOp], step: int) -> list[str]:
    """The files one rank's ops of the step-``step`` save left: opened for writing, followed
    through renames, less those deleted afterwards; files staged in ``$TMPDIR`` named by where
    they were moved."""
    present: set[str] = set()
    for op in (o for o in ops if o.step == step):
        if op.kind == "open":
            present.add(op.path)
        elif op.kind == "rename" and (op.path in present or not op.path):  # "": moved in from outside
            present.discard(op.path)
            if op.target:
                present.add(op.target)
        elif op.kind == "unlink":
            present.discard(op.path)
    return sorted(p for p in present if p and not p.startswith(STAGING_PREFIX))


def rank_files(trace_dir: Path, rank: int, step: int) -> list[str]:
    """``files_written`` of ``rank``'s trace (none when it left no trace)."""
    try:
        ops, _ = read_trace(trace_dir, rank)
    except FileNotFoundError:
        return []
    return files_written(ops, step)


def saved_steps(trace_dir: Path, world_size: int) -> list[int]:
    """The steps whose saves any rank's trace records, in order."""
    steps: set[int] = set()
    for rank in range(world_size):
        try:
            steps |= {op.step for op in read_trace(trace_dir, rank)[0]}
        except FileNotFoundError:
            continue
    return sorted(steps)


def top_directories(paths: list[str]) -> set[str]:
    return {p.split("/")[0] for p in paths if "/" in p}


def stale_text(text: str, step: int, older: int, new_dirs: set[str], old_dirs: set[str]) -> str | None:
    """``text`` as the pointer said it one save earlier: the step-``step`` save's directory replaced
    by the older save's, or else the step number by the older one (its zero padding kept); None
    when the text names neither (not a pointer to that save)."""
    if len(new_dirs) == 1 and len(old_dirs) == 1:
        (new,), (old,) = new_dirs, old_dirs
        if new in text:
            return text.replace(new, old)
    number = re.compile(rf"(?<!\d)0*{step}(?!\d)")
    if number.search(text):
        return number.sub(lambda m: str(older).zfill(len(m.group(0))), text)
    return None


def pointer_text(path: Path) -> str | None:
    """The text of a small file that can be a pointer, or None (too big, or not text)."""
    try:
        if path.stat().st_size > MAX_POINTER_BYTES:
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
