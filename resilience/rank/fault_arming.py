"""Arming a fault in a rank process: the one sequence the harness's worker and the black-box hook
share. The write interception goes in first (only where a listener asks: ``torch.save`` given a
path writes from C++, and the real thing should stay real), then ``arm``, then the read
interception (asked once armed: it may depend on the incarnation)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..faults.base import Fault, RankEnvironment, ReadListener, WriteListener


def arm_in_rank(fault: Fault | None, env: RankEnvironment, staging: Path | None = None,
                listeners: Sequence[WriteListener] = (), read_listeners: Sequence[ReadListener] = ()) -> None:
    """``listeners``, ``read_listeners``: further write and read listeners of the rank itself (the
    black-box hook's record of written and read files), installed with the fault's; ``staging``:
    the rank's $TMPDIR, whose files listeners see as ``$TMPDIR/...``."""
    from ..disk.interception import Interceptor

    writers = list(listeners)
    if isinstance(fault, WriteListener) and fault.needs_interception():
        writers.insert(0, fault)
    if writers:
        Interceptor(env.checkpoint_dir, writers, staging=staging).install()
    if fault is not None:
        fault.arm(env)
    readers = list(read_listeners)
    if isinstance(fault, ReadListener) and fault.needs_read_interception():
        readers.append(fault)  # after the recorders: a read it fails at the open is on record too
    if readers:
        from ..disk.read_interception import ReadInterceptor

        ReadInterceptor(env.checkpoint_dir, readers).install()
