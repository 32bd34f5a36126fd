"""Post-crash disk states of one traced save (the ALICE / LazyFS model, for checkpoints).

The model, for a power cut somewhere inside the save of step S:

- everything the earlier saves wrote is durable (the kernel wrote it back long ago);
- the power cut is one instant for every rank (one power domain): each rank got through the ops
  it had started before that instant (``CrashPoint.cuts``: one rank may be done while another has
  not begun). Ranks are not cut independently of each other: a rank that waits in a collective for
  a peer cannot be further along than that peer. The trace records the collectives, and the ops
  are taken in one order that respects them and is the same in every run
  (`resilience.disk.interleaving`): the instants are the prefixes of that order;
- file data: an ``fsync`` (or ``fdatasync``) makes the file's data durable; data written since a
  file's last fsync reaches the disk whole (``keep``), not at all (``drop``), as a prefix of the
  written bytes (``prefix``: a torn write sequence; the truncation of an ``open(..., "w")`` happens,
  so a prefix of 0 bytes is the 0-byte file seen after real power cuts), or in full except a range
  of 4 KiB blocks that reads as zeros (``zeros``: the size reached the disk, those blocks never did);
- namespace operations (create, rename, unlink, mkdir, rmdir) persist in the order they happened,
  as a journaling filesystem commits them; a directory fsync commits every one before it; those
  after the last commit persist only as a prefix (``lost_metadata`` of them, from the end, are lost).
  A file fsync does not persist the file's name: POSIX asks for a directory fsync for that;
- node agents that persist the save in the background (their traces follow the ranks': stream
  ``world_size + node``) lose power at the same instant, and their memory with it: the save counts
  as returned only where every agent's persist of it had returned too.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import HarnessError
from .interception import STAGING_PREFIX
from .interleaving import canonical
from .io_trace import TraceOp, payload_path, read_payload, read_trace, trace_paths
from .replay_fs import ReplayFilesystem
from .state_tree import read_tree, state_hash

BLOCK = 4096
HOW = ("keep", "drop", "prefix", "zeros")  # simplest first: Hypothesis shrinks towards the front


@dataclass(frozen=True)
class Loss:
    """What reached the disk of one file's data written since its last fsync."""

    path: str
    how: str  # one of HOW
    keep_bytes: int = 0  # prefix: how many of the unsynced written bytes reached the disk
    zero_from: int = 0  # zeros: the file range [zero_from, zero_to) that never did
    zero_to: int = 0


@dataclass(frozen=True)
class CrashPoint:
    """One power cut: how far each rank got, and what of the volatile state reached the disk."""

    cuts: tuple[int, ...]  # per rank: how many of its ops of the save happened
    lost_metadata: int = 0  # namespace ops not yet committed, lost from the end
    losses: tuple[Loss, ...] = ()  # one per file with unsynced data that is still named on disk


@dataclass(frozen=True)
class Volatile:
    """What a cut leaves uncommitted, for drawing the rest of a `CrashPoint`."""

    metadata: tuple[TraceOp, ...]  # uncommitted namespace ops, in order
    dirty: tuple[tuple[str, int, int], ...]  # (path, unsynced bytes written, size with them) per file


class CrashModel:
    """The traced save of ``step`` and the durable state before it; builds crash states."""

    def __init__(self, trace_dir: Path, world_size: int, step: int):
        self.step, self.trace_dir, self.world_size = step, trace_dir, world_size
        self.before: list[tuple[TraceOp, Path]] = []
        traced: list[list[TraceOp]] = []
        self.data_paths: list[Path] = []
        streams = world_size
        while trace_paths(trace_dir, streams)[0].exists():  # the node agents' after the ranks'
            streams += 1
        for rank in range(streams):
            ops, data_path = read_trace(trace_dir, rank)
            self.data_paths.append(data_path)
            self.before.extend((op, data_path) for op in ops if op.step < step and op.kind != "sync")
            traced.append([op for op in ops if op.step == step])
        self.before.sort(key=lambda item: item[0].order)
        persisted = [{op.step for op, _ in self.before if op.rank == agent and op.kind == "returned"}
                     for agent in range(world_size, streams)]
        self.persisted_before = set.intersection(*persisted) if persisted else None
        # per rank, the explored save's ops in that rank's order, placed in the one order of every run;
        # the earlier saves are all durable, so their instants only need to come first
        self.ops, self.order_note = canonical(traced[:world_size], traced[world_size:])
        self.before = [(replace(op, time_ns=index - len(self.before)), path)
                       for index, (op, path) in enumerate(self.before)]
        self.merged = sorted((op for ops in self.ops for op in ops), key=lambda op: op.order)
        self._payloads: dict[tuple[int, int], bytes] = {}

    @property
    def op_counts(self) -> tuple[int, ...]:
        return tuple(len(ops) for ops in self.ops)

    def boundaries(self) -> list[int]:
        """The instants worth telling apart, as counts of the save's ops (all ranks, in global
        order) that happened: 0, and after every op except a write that its rank's next op, another
        write to the same file, follows (a cut inside such a run leaves what a cut after the run
        leaves with only a prefix of the run's bytes: the ``prefix`` loss)."""
        inside_run = set()
        for ops in self.ops:
            for op, following in itertools.pairwise(ops):
                if op.kind == following.kind == "write" and op.path == following.path:
                    inside_run.add((op.rank, op.seq))
        return [0] + [index + 1 for index, op in enumerate(self.merged) if (op.rank, op.seq) not in inside_run]

    def cuts_at(self, count: int) -> tuple[int, ...]:
        """Per rank, how many of its ops are among the first ``count`` of the global order: the
        power cut is one instant for every rank, each caught at its own op."""
        cuts = [0] * len(self.ops)
        for op in self.merged[:count]:
            cuts[op.rank] += 1
        return tuple(cuts)

    def _payload(self, op: TraceOp) -> bytes | None:
        if op.kind != "write":
            return None
        key = (op.rank, op.seq)
        if key not in self._payloads:
            self._payloads[key] = read_payload(payload_path(self.trace_dir, op), op)
        return self._payloads[key]

    def _replay(self, cuts: tuple[int, ...]) -> ReplayFilesystem:
        fs = ReplayFilesystem()
        for op, _ in self.before:
            fs.apply(op, self._payload(op))
        fs.sync_everything()
        happened = sorted((op for rank, ops in enumerate(self.ops) for op in ops[:cuts[rank]]),
                          key=lambda op: op.order)
        for op in happened:
            fs.apply(op, self._payload(op))
        return fs

    def volatile(self, cuts: tuple[int, ...]) -> Volatile:
        fs = self._replay(cuts)
        return Volatile(metadata=tuple(fs.uncommitted), dirty=tuple(self._dirty(fs, fs.names)))

    @staticmethod
    def _dirty(fs: ReplayFilesystem, names: dict[str, int]):
        """(path, unsynced bytes, size) of each named file with pending data, in the order it became dirty."""
        named = sorted(((fs.inodes[inode].first_dirty, path, inode) for path, inode in names.items()
                        if fs.inodes[inode].pending))
        return [(path, fs.inodes[inode].unsynced_bytes(), len(fs.inodes[inode].applied()))
                for _, path, inode in named]

    def disk(self, point: CrashPoint) -> tuple[dict[str, bytes], set[str]]:
        """The files (path -> content) and directories a power cut at ``point`` leaves on disk."""
        fs = self._replay(point.cuts)
        fs.commit(max(0, len(fs.uncommitted) - point.lost_metadata))
        # a loss is named by the file's path at the moment of the crash (volatile namespace)
        volatile_path = {inode: path for path, inode in fs.names.items()}
        losses = {loss.path: loss for loss in point.losses}
        files = {}
        for path, inode in fs.durable_names.items():
            if path.startswith(STAGING_PREFIX):  # left in $TMPDIR: not part of the checkpoint directory
                continue
            node = fs.inodes[inode]
            loss = losses.get(volatile_path.get(inode, path))
            if not node.pending or loss is None or loss.how == "keep":
                files[path] = bytes(node.applied())
            elif loss.how == "drop":
                files[path] = bytes(node.durable)
            elif loss.how == "prefix":
                files[path] = bytes(node.applied(loss.keep_bytes))
            else:
                files[path] = bytes(node.with_zeros(loss.zero_from, loss.zero_to))
        return files, set(fs.durable_dirs)

    def returned(self, point: CrashPoint) -> frozenset[int]:
        """The ranks whose ``save`` had returned before the power cut; none where a node agent's
        persist of the save had not (the ranks' save was into memory the cut erased)."""
        done = {stream for stream, (cut, ops) in enumerate(zip(point.cuts, self.ops, strict=False))
                if cut and ops[cut - 1].kind == "returned"}
        if any(agent not in done for agent in range(self.world_size, len(self.ops))):
            return frozenset()
        return frozenset(rank for rank in done if rank < self.world_size)

    def survives(self, step: int) -> bool:
        """Whether an earlier save, of ``step``, outlives the power cut: always, but where node agents
        persist the saves, only one that every agent's persist had returned (the rest were memory)."""
        return self.persisted_before is None or step in self.persisted_before

    def stream_name(self, stream: int) -> str:
        """A trace stream in words: a rank, or a node agent."""
        return f"rank {stream}" if stream < self.world_size else f"node {stream - self.world_size}'s agent"

    def sweep(self) -> list[CrashPoint]:
        """At every boundary instant: nothing volatile lost (what killing every rank leaves), then
        everything volatile lost (unsynced data dropped, uncommitted namespace ops undone)."""
        points = []
        for count in self.boundaries():
            cuts = self.cuts_at(count)
            volatile = self.volatile(cuts)
            points.append(CrashPoint(cuts=cuts))
            points.append(CrashPoint(cuts=cuts, lost_metadata=len(volatile.metadata),
                                     losses=tuple(Loss(path, "drop") for path, _, _ in volatile.dirty)))
        return points

    def complete(self) -> CrashPoint:
        """No crash at all: every op happened and everything reached the disk."""
        return CrashPoint(cuts=self.op_counts)

    def describe(self, point: CrashPoint) -> list[str]:
        """The crash in words: where each rank was cut, what was lost."""
        lines = []
        for rank, (cut, ops) in enumerate(zip(point.cuts, self.ops, strict=False)):
            if cut == 0:
                where = "before its first operation of the save"
            else:
                where = f"after op {cut} of {len(ops)} ({ops[cut - 1].describe()})"
            upcoming = f"; next would have been: {ops[cut].describe()}" if cut < len(ops) else ""
            lines.append(f"{self.stream_name(rank)} lost power {where}{upcoming}")
        volatile = self.volatile(point.cuts)
        if point.lost_metadata:
            lost = volatile.metadata[len(volatile.metadata) - point.lost_metadata:]
            lines.append("never committed to the directory: " + "; ".join(
                f"{self.stream_name(op.rank)} {op.describe()}" for op in lost))
        sizes = {path: (unsynced, size) for path, unsynced, size in volatile.dirty}
        for loss in point.losses:
            unsynced, size = sizes.get(loss.path, (0, 0))
            if loss.how == "keep":
                continue
            head = f"{loss.path}: {unsynced} unsynced bytes (file size {size})"
            if loss.how == "drop":
                lines.append(f"{head} all lost")
            elif loss.how == "prefix":
                lines.append(f"{head} torn: only the first {loss.keep_bytes} written bytes reached the disk")
            else:
                lines.append(f"{head} reached the disk except bytes {loss.zero_from}..{loss.zero_to}, "
                             f"which read as zeros (blocks never written back)")
        return lines


def check_fidelity(model: CrashModel, checkpoint_dir: Path) -> None:
    """The trace, replayed in full, must give the checkpoint directory the first run left."""
    files, dirs = model.disk(model.complete())
    real_files, real_dirs = read_tree(checkpoint_dir)
    if state_hash(files, dirs) == state_hash(real_files, real_dirs):
        return
    differing = sorted(path for path in files.keys() | real_files.keys() if files.get(path) != real_files.get(path))
    differing += sorted(f"{d}/" for d in dirs ^ real_dirs)
    raise HarnessError("the IO trace does not rebuild the checkpoint directory (something wrote past the "
                       f"interception layer: os.write on a raw descriptor, another process); differing: "
                       f"{', '.join(differing[:10])}")
