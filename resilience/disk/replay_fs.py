"""The in-memory filesystem a traced save is replayed on: namespace and file data, each with what
is durable and what is still volatile (the page cache, the uncommitted journal), for
`resilience.disk.crash_states` to cut."""
from __future__ import annotations

from dataclasses import dataclass, field

from .io_trace import TraceOp


@dataclass
class Inode:
    """One file's data: what is durable, and the ops since its last fsync that are not yet."""

    durable: bytearray = field(default_factory=bytearray)
    pending: list = field(default_factory=list)  # ("write", offset, bytes) or ("truncate", size)
    first_dirty: tuple = ()

    def applied(self, keep_bytes: int | None = None) -> bytearray:
        """Durable data plus the pending ops, writes limited to ``keep_bytes`` bytes in all."""
        data = bytearray(self.durable)
        budget = keep_bytes
        for op in self.pending:
            if op[0] == "truncate":
                del data[op[1]:]
                continue
            _, offset, payload = op
            if budget is not None:
                payload, budget = payload[:budget], max(0, budget - len(payload))
            if not payload:
                continue
            if len(data) < offset:
                data.extend(bytes(offset - len(data)))
            data[offset:offset + len(payload)] = payload
        return data

    def unsynced_bytes(self) -> int:
        return sum(len(op[2]) for op in self.pending if op[0] == "write")

    def with_zeros(self, start: int, end: int) -> bytearray:
        """Everything kept except the pending writes' bytes in [start, end): the old data where the
        file was overwritten in place, zeros where it was new."""
        data = self.applied()
        old = b"" if any(op[0] == "truncate" for op in self.pending) else bytes(self.durable)
        for op in self.pending:
            if op[0] != "write":
                continue
            lo, hi = max(start, op[1]), min(end, op[1] + len(op[2]), len(data))
            for position in range(lo, hi):
                data[position] = old[position] if position < len(old) else 0
        return data


class ReplayFilesystem:
    """The namespace and file data, durable and volatile, while a trace is replayed."""

    def __init__(self):
        self.inodes: list[Inode] = []
        self.names: dict[str, int] = {}  # volatile: path -> inode
        self.dirs: set[str] = {"."}
        self.durable_names: dict[str, int] = {}
        self.durable_dirs: set[str] = {"."}
        self.uncommitted: list[TraceOp] = []
        self.handles: dict[tuple[int, str], int] = {}  # (rank, path) -> inode of an open file
        self.created: dict[tuple, int] = {}  # order of an open that created a file -> its inode

    def apply(self, op: TraceOp, payload: bytes | None) -> None:
        kind = op.kind
        if kind == "open":
            inode = self.names.get(op.path)
            if inode is None:
                self.inodes.append(Inode())
                inode = self.names[op.path] = self.created[op.order] = len(self.inodes) - 1
                self.uncommitted.append(op)
            if op.truncate:
                self._pending(inode, op, ("truncate", 0))
            self.handles[(op.rank, op.path)] = inode
        elif kind == "write":
            inode = self.handles.get((op.rank, op.path), self.names.get(op.path))
            if inode is not None:
                self._pending(inode, op, ("write", op.offset, payload))
        elif kind == "close":
            self.handles.pop((op.rank, op.path), None)
        elif kind == "fsync":
            inode = self.handles.get((op.rank, op.path), self.names.get(op.path))
            if inode is not None:
                node = self.inodes[inode]
                node.durable, node.pending, node.first_dirty = node.applied(), [], ()
        elif kind == "dir_fsync":
            self.commit()
        elif kind in ("rename", "unlink", "mkdir", "rmdir"):
            _namespace(op, self.names, self.dirs)
            self.uncommitted.append(op)

    def _pending(self, inode: int, op: TraceOp, entry: tuple) -> None:
        node = self.inodes[inode]
        if not node.pending:
            node.first_dirty = op.order
        node.pending.append(entry)

    def commit(self, count: int | None = None) -> None:
        """Make the first ``count`` uncommitted namespace ops durable (all by default)."""
        count = len(self.uncommitted) if count is None else count
        for op in self.uncommitted[:count]:
            if op.kind == "open":
                self.durable_names[op.path] = self.created[op.order]
            else:
                _namespace(op, self.durable_names, self.durable_dirs)
        del self.uncommitted[:count]

    def sync_everything(self) -> None:
        self.commit()
        for node in self.inodes:
            node.durable, node.pending, node.first_dirty = node.applied(), [], ()


def _namespace(op: TraceOp, names: dict[str, int], dirs: set[str]) -> None:
    if op.kind == "mkdir":
        dirs.add(op.path)
    elif op.kind == "rmdir":
        dirs.discard(op.path)
    elif op.kind == "unlink":
        names.pop(op.path, None)
    elif op.kind == "rename":
        if op.path in names:
            names[op.target] = names.pop(op.path)
        elif op.path in dirs:  # a directory: everything under it moves with it
            prefix = op.path + "/"
            for path in [p for p in names if p.startswith(prefix)]:
                names[op.target + "/" + path[len(prefix):]] = names.pop(path)
            for path in [d for d in dirs if d == op.path or d.startswith(prefix)]:
                dirs.discard(path)
                dirs.add(op.target + path[len(op.path):])
