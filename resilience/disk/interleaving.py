"""One order of every rank's ops in a save, the same in every run.

The trace's clock tells how the ranks' ops interleaved in the traced run; another run interleaves
them otherwise, and a model that followed the clock would visit other crash instants and find
other states. Collectives bound what can interleave (`resilience.disk.collective_hooks`): the ops of
a rank between two whole-world collectives form an epoch, and no op of epoch E+1 of any rank
happens before an op of epoch E of another. The model orders the ops epoch by epoch, and inside an
epoch takes the ranks in turn, each in its own order (rank 0's first op, rank 1's first, rank 0's
second, ...): the ranks in lockstep, an interleaving every run can have.

The ranks must agree on the number of collectives; where they do not (a rank that skipped one
would hang its peers, so it is a trace that missed one), the clock's order is kept and the model
says it may differ between runs.

Node agents that persist the save in the background (DLRover's saver) begin only once a rank's save
handed them the step, and take part in no collective: their ops come after every rank's, in the
clock's order (with one agent, its own order; with several, the run's interleaving, which respects
what one agent waits for of another).
"""
from __future__ import annotations

import itertools
from dataclasses import replace

from .io_trace import TraceOp

SYNC = "sync"  # the trace op marking a collective that returned


def canonical(ops_per_rank: list[list[TraceOp]],
              background: list[list[TraceOp]] = ()) -> tuple[list[list[TraceOp]], str]:
    """Each rank's ops without the sync markers, then each background stream's (a node agent's),
    with ``time_ns`` replaced by the op's position in the order above (so every ``op.order``
    follows it), and "" or why the clock's order was kept."""
    ranks, note = _ranks_in_order(ops_per_rank)
    after = sorted((op for ops in background for op in ops), key=lambda op: op.order)
    start = sum(len(ops) for ops in ranks)
    position = {(op.rank, op.seq): start + index for index, op in enumerate(after)}
    return ranks + [[replace(op, time_ns=position[(op.rank, op.seq)]) for op in ops] for ops in background], note


def _ranks_in_order(ops_per_rank: list[list[TraceOp]]) -> tuple[list[list[TraceOp]], str]:
    epochs = [_epochs(ops) for ops in ops_per_rank]
    kept = [[op for op in ops if op.kind != SYNC] for ops in ops_per_rank]
    counts = {len(rank_epochs) for rank_epochs in epochs}
    if len(counts) > 1:
        note = ("the ranks' traces hold different numbers of collectives ("
                + ", ".join(f"rank {rank}: {len(e) - 1}" for rank, e in enumerate(epochs))
                + "): the ops keep the order of the traced run's clock, which another run may interleave otherwise")
        return _positioned(kept, sorted((op for ops in kept for op in ops), key=lambda op: op.order)), note
    ordered = []
    for epoch in range(counts.pop() if counts else 0):
        turns = itertools.zip_longest(*(rank_epochs[epoch] for rank_epochs in epochs))
        ordered.extend(op for turn in turns for op in turn if op is not None)
    return _positioned(kept, ordered), ""


def _epochs(ops: list[TraceOp]) -> list[list[TraceOp]]:
    epochs: list[list[TraceOp]] = [[]]
    for op in ops:
        if op.kind == SYNC:
            epochs.append([])
        else:
            epochs[-1].append(op)
    return epochs


def _positioned(kept: list[list[TraceOp]], ordered: list[TraceOp]) -> list[list[TraceOp]]:
    position = {(op.rank, op.seq): index for index, op in enumerate(ordered)}
    return [[replace(op, time_ns=position[(op.rank, op.seq)]) for op in ops] for ops in kept]
