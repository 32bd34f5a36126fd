"""torch's compile cache, kept inside the run that made it.

torch 2.13.0 makes its compile cache directory, ``$TMPDIR/torchinductor_<user>``, as soon as
``torch._dynamo`` loads (DeepSpeed's and megatron-core's imports load it) and never removes it.
Every process a run starts (forked or spawned ranks, node agents, a script's torchrun and its
workers, a checkpoint check in its own interpreter) inherits ``TORCHINDUCTOR_CACHE_DIR`` from the
run's own process, so the run sets it once, before it starts any, to a directory that lives as long
as that process: removed at its exit, or by the janitor if it is killed first.

Call order: ``keep_in_this_run()`` in the run's own process (the command line, the pytest plugin's
controller, a `Harness` made in a user's program) before the first process starts; later calls,
and processes that find the variable set (an xdist worker, a command a test runs), change nothing.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from . import janitor

VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def keep_in_this_run() -> None:
    """Point torch's compile cache at a directory of this process's own, unless one is set."""
    if VARIABLE in os.environ:
        return
    path = tempfile.mkdtemp(prefix="resilience-compile-cache-")
    janitor.register("dir", path)
    os.environ[VARIABLE] = path
    atexit.register(_remove, path, os.getpid())


def _remove(path: str, owner: int) -> None:
    if os.getpid() != owner:  # a forked child that exits through atexit leaves its parent's directory
        return
    shutil.rmtree(path, ignore_errors=True)
    janitor.release("dir", path)
