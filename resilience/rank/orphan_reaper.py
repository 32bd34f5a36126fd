"""Preloaded into a rank fork server, first: the server becomes the reaper of what its ranks leave
behind. A process a rank started that outlives it (a library's ``multiprocessing`` Manager that
is never shut down, one fresh interpreter per rank: see docs/performance.md) would otherwise be
re-parented to init, which reaps it and its CPU time, so the harness's count of a case's CPU
(`core.processes.tree_cpu_seconds`) would miss it. Re-parented to the server instead, it is reaped by
the server's own loop (``waitpid(-1)`` on SIGCHLD) and counted in the server's children's time.
The setting is not inherited by the ranks forked from the server (prctl(2)).
"""
from __future__ import annotations

import ctypes
import sys
import warnings

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def imported_by_fork_server() -> bool:
    """Whether multiprocessing's forkserver ``main`` is importing this module as a preload: only
    that process reaps children it did not fork (a harness that imported this would collect zombies)."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


def become_reaper() -> bool:
    """Make this process the reaper of its descendants' orphans; False where the kernel cannot."""
    # multiprocessing's forkserver warns for each child it reaps that it did not fork itself
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid", category=UserWarning)
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: orphans go to init, their CPU uncounted
        return False


IS_REAPER = imported_by_fork_server() and become_reaper()
