"""Preloaded into a rank fork server, first: the server becomes the reaper of what its ranks leave
behind. A process a rank started that outlives it (a library's ``multiprocessing`` Manager that
is never shut down, one fresh interpreter per rank: see docs/performance.md) would otherwise be
re-parented to init, which reaps it and its CPU time, so the harness's count of a case's CPU
(`core.processes.tree_cpu_seconds`) would miss it. Re-parented to the server instead, it is reaped by
the server's own loop (``waitpid(-1)`` on SIGCHLD) and counted in the server's children's time.
The setting is not inherited by the ranks forked from the server (prctl(2)). A process below a
rank that takes a parent of pid 1 for a dead parent (``core.processes.die_with_parent``'s check for
a parent gone before its request took effect) sees the server instead; none is started below a
forked rank today.
"""
from __future__ import annotations

import sys
import warnings

from ..core.processes import become_subreaper


def imported_by_fork_server() -> bool:
    """Whether multiprocessing's forkserver ``main`` is importing this module as a preload: only
    that process reaps children it did not fork (a harness that imported this would collect zombies).
    A rank forked from the server has ``main`` below it too, past its preload: its loop's
    ``pid_to_fd`` is bound by then."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return "pid_to_fd" not in frame.f_locals
        frame = frame.f_back
    return False


if imported_by_fork_server():
    # multiprocessing's forkserver warns for each child it reaps that it did not fork itself
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid", category=UserWarning)
    become_subreaper()  # where the kernel cannot: orphans go to init, their CPU uncounted
