"""SIGTERM (what a CI time limit, ``timeout``, a scheduler or a container stop sends) ends a command
as Ctrl-C does: raised as an interrupt in the main thread, so the same unwinding stops the
processes, unmounts and removes what the run started, and ``atexit`` handlers (multiprocessing's
removal of its ``pymp-*`` directory) run, which SIGTERM's default action would skip."""
from __future__ import annotations

import os
import signal
import threading

SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered where a KeyboardInterrupt would be."""


def end_like_ctrl_c_on_sigterm() -> None:
    """Make SIGTERM raise `Terminated` in this process's main thread. Called once at the start of
    a command (the CLI, the pytest plugin's configure in the controller and in each worker, the
    benchmark). A process forked from this one later keeps SIGTERM's default action: the handler
    sees another pid and re-sends the signal with the default restored."""
    if threading.current_thread() is not threading.main_thread():
        return
    owner = os.getpid()

    def on_sigterm(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
