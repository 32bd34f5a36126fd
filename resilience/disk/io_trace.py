"""IO trace recording: every file operation a rank makes under the checkpoint directory, in order.

The interception layer already reports ``open`` / ``write`` / ``close`` of files (``open``,
``io.open`` and ``torch.save`` given a path); this module adds the namespace operations that a
crash model needs and that never pass through a file object: ``os.rename`` / ``os.replace``,
``os.unlink`` / ``os.remove``, ``os.mkdir`` (so ``os.makedirs`` and ``Path.mkdir``), ``os.rmdir``,
and ``os.fsync`` / ``os.fdatasync`` on any descriptor, a directory's included (the descriptor is
resolved through ``/proc/self/fd``, so an ``os.open(dir, O_RDONLY)`` needs no hook of its own).

Each rank writes ``trace_rank<R>.jsonl`` (one `TraceOp` per line) and ``trace_rank<R>.data`` (the
bytes of every write, appended; a write op holds its span in that file). Ops carry a per-rank
sequence number and ``time.monotonic_ns()``, which is one clock for every process of the machine,
so the ops of all ranks merge into one global order.
"""
from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .interception import STAGING_PREFIX

OP_KINDS = ("open", "write", "fsync", "close", "rename", "unlink", "mkdir", "rmdir", "dir_fsync", "returned", "sync")


@dataclass(frozen=True)
class TraceOp:
    """One file operation of one rank during one save.

    ``kind``: ``open`` (``truncate``: the mode empties the file; a missing path is created),
    ``write`` (``length`` bytes at ``offset``, stored at ``data_offset`` in the rank's data file),
    ``fsync`` (of a file: its data is durable), ``close``, ``rename`` (``path`` -> ``target``,
    replacing it), ``unlink``, ``mkdir``, ``rmdir``, ``dir_fsync`` (the directory's entries are
    durable), ``returned`` (the rank's ``save`` returned: a marker, no IO) and ``sync`` (a collective
    over every rank returned, ``target`` its name: a marker, `resilience.disk.collective_hooks`).
    Paths are relative to the checkpoint directory, with ``/``.
    """

    rank: int
    seq: int
    time_ns: int
    step: int  # the save this op belongs to
    kind: str
    path: str = ""
    target: str = ""  # rename only
    offset: int = 0  # write only
    length: int = 0  # write only
    data_offset: int = 0  # write only: where its bytes are in the rank's data file
    truncate: bool = False  # open only
    source: str = ""  # the process that made it: "" the rank itself, "fork<pid>" a writer it forked

    @property
    def order(self) -> tuple[int, int, int]:
        """Position in the global order of every rank's ops."""
        return (self.time_ns, self.rank, self.seq)

    def describe(self) -> str:
        if self.kind == "write":
            return f"write {self.path} bytes {self.offset}..{self.offset + self.length}"
        if self.kind == "rename":
            return f"rename {self.path} -> {self.target}"
        if self.kind == "open":
            return f"open{' (truncating)' if self.truncate else ''} {self.path}"
        if self.kind == "returned":
            return f"save of step {self.step} returned"
        return f"{self.kind} {self.path}"


def trace_paths(directory: Path, rank: int, source: str = "") -> tuple[Path, Path]:
    """(ops, data) files of ``rank`` in ``directory`` (``source``: of a writer process it forked)."""
    stem = f"trace_rank{rank}" + (f".{source}" if source else "")
    return directory / f"{stem}.jsonl", directory / f"{stem}.data"


class TraceWriter:
    """Appends one rank's ops and write payloads to its trace files. One per rank process."""

    def __init__(self, directory: Path, rank: int, source: str = ""):
        self.rank, self.directory, self.source = rank, directory, source
        ops_path, data_path = trace_paths(directory, rank, source)
        directory.mkdir(parents=True, exist_ok=True)
        # Opened before any hook is installed: the trace itself is never traced.
        self._ops = open(ops_path, "a", encoding="utf-8")  # open for the rank's life
        self._data = open(data_path, "ab")
        self._data_size = self._data.tell()
        self._seq = 0
        # a forked writer ends with os._exit (multiprocessing's children do): nothing may wait in a buffer
        self._flush_each = bool(source)
        self._closed = False

    def follow_forks(self) -> None:
        """A process the rank forks (megatron-core's writer workers) records into trace files of its
        own (flushed before the fork, so nothing buffered is written twice); ``read_trace`` merges
        them into the rank's ops by the one monotonic clock."""
        def in_child() -> None:
            if self._closed:  # a fork after the trace ended: nothing to follow
                return
            self._ops.close()  # the child's copies of the rank's files, empty after the flush
            self._data.close()
            self.__init__(self.directory, self.rank, f"fork{os.getpid()}")

        os.register_at_fork(before=self.flush, after_in_child=in_child)

    def record(self, step: int, kind: str, payload: bytes | None = None, **fields: Any) -> TraceOp:
        if payload is not None:
            fields.update(data_offset=self._data_size, length=len(payload))
            self._data.write(payload)
            self._data_size += len(payload)
        op = TraceOp(rank=self.rank, seq=self._seq, time_ns=time.monotonic_ns(), step=step, kind=kind,
                     source=self.source, **fields)
        self._seq += 1
        self._ops.write(json.dumps(asdict(op)) + "\n")
        if self._flush_each:
            self.flush()
        return op

    def flush(self) -> None:
        """Make the trace complete on disk (a rank may end with os._exit right after)."""
        if self._closed:
            return
        self._data.flush()
        self._ops.flush()

    def close(self) -> None:
        self.flush()
        self._closed = True
        self._data.close()
        self._ops.close()


def _inside(absolute: str, root: Path) -> str | None:
    relative = os.path.relpath(absolute, root)
    if relative == "." or relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return None
    return relative.replace(os.sep, "/")


def read_trace(directory: Path, rank: int) -> tuple[list[TraceOp], Path]:
    """The ops of ``rank`` in its own order, and its data file. Ops of writer processes it forked
    are merged in by time and every op renumbered (``seq``: its place in the rank's order)."""
    ops_path, data_path = trace_paths(directory, rank)
    paths = [ops_path] + sorted(directory.glob(f"trace_rank{rank}.fork*.jsonl"))
    ops = [TraceOp(**json.loads(line)) for path in paths for line in path.read_text(encoding="utf-8").splitlines()
           if line]
    if len(paths) > 1:
        ops = [replace(op, seq=index) for index, op in enumerate(sorted(ops, key=lambda op: (op.time_ns, op.source)))]
    return ops, data_path


def payload_path(directory: Path, op: TraceOp) -> Path:
    """The data file holding a write op's bytes."""
    return trace_paths(directory, op.rank, op.source)[1]


def read_payload(data_path: Path, op: TraceOp) -> bytes:
    with open(data_path, "rb") as f:
        f.seek(op.data_offset)
        return f.read(op.length)


class NamespaceHooks:
    """Reports namespace operations and fsyncs on paths under ``root`` to ``report(kind, **fields)``;
    with ``staging`` (the rank's ``$TMPDIR``), also those on paths under it, named ``$TMPDIR/<name>``
    as the interception names them (Lightning's atomic save moves its staged file into place).

    Installed in a rank process after the interception layer (so it wraps its ``os.fsync``);
    ``uninstall`` restores what it replaced, in reverse order. ``report`` is called after the real
    call succeeded: an operation that failed did not happen."""

    def __init__(self, root: Path, report: Callable[..., None], staging: Path | None = None):
        self.root = Path(os.path.abspath(root))
        self.staging = Path(os.path.abspath(staging)) if staging is not None else None
        self.report = report
        self._saved: list[tuple[Any, str, Any]] = []

    def relative(self, path: Any, dir_fd: int | None = None) -> str | None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return None
        path = os.fsdecode(path)
        if dir_fd is not None:  # relative to a directory descriptor (shutil.rmtree's): placed through /proc
            try:
                path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
            except OSError:
                return None
        absolute = os.path.abspath(path)
        inside = _inside(absolute, self.root)
        if inside is None and self.staging is not None:
            staged = _inside(absolute, self.staging)
            return None if staged is None else STAGING_PREFIX + staged
        return inside

    def fd_relative(self, fd: int) -> tuple[str | None, bool]:
        """The path under the root that ``fd`` refers to (None if elsewhere), and whether it is a directory."""
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        except OSError:
            return None, False
        absolute = os.path.abspath(path)
        if absolute == str(self.root):
            return ".", is_dir
        return self.relative(absolute), is_dir

    def install(self) -> None:
        real = {name: getattr(os, name) for name in ("rename", "replace", "unlink", "remove", "mkdir", "rmdir",
                                                      "fsync", "fdatasync")}

        def rename_like(name):
            def hooked(src, dst, *args, **kwargs):
                result = real[name](src, dst, *args, **kwargs)
                source = self.relative(src, kwargs.get("src_dir_fd"))
                target = self.relative(dst, kwargs.get("dst_dir_fd"))
                if source is not None or target is not None:
                    self.report("rename", path=source or "", target=target or "")
                return result
            return hooked

        def path_op(name, kind):
            def hooked(path, *args, **kwargs):
                try:
                    result = real[name](path, *args, **kwargs)
                except FileExistsError:
                    # ranks that all create the save's directory race for it: each one's trace holds
                    # its mkdir whichever won, so a rank's ops do not depend on the race (a no-op replayed)
                    if kind == "mkdir" and (relative := self.relative(path, kwargs.get("dir_fd"))) is not None:
                        self.report(kind, path=relative)
                    raise
                relative = self.relative(path, kwargs.get("dir_fd"))
                if relative is not None:
                    self.report(kind, path=relative)
                return result
            return hooked

        def sync_op(name):
            def hooked(fd):
                number = fd if isinstance(fd, int) else fd.fileno()
                result = real[name](fd)
                relative, is_dir = self.fd_relative(number)
                if relative is not None:
                    self.report("dir_fsync" if is_dir else "fsync", path=relative)
                return result
            return hooked

        replacements = {"rename": rename_like("rename"), "replace": rename_like("replace"),
                        "unlink": path_op("unlink", "unlink"), "remove": path_op("remove", "unlink"),
                        "mkdir": path_op("mkdir", "mkdir"), "rmdir": path_op("rmdir", "rmdir"),
                        "fsync": sync_op("fsync"), "fdatasync": sync_op("fdatasync")}
        for name, new in replacements.items():
            self._saved.append((os, name, getattr(os, name)))
            setattr(os, name, new)

    def uninstall(self) -> None:
        while self._saved:
            owner, name, old = self._saved.pop()
            setattr(owner, name, old)
