"""Emergency checkpoints on SIGTERM: what a training job does when SLURM or Kubernetes preempts it.

The scheduler sends SIGTERM, waits a grace period (SLURM's KillWait, Kubernetes'
terminationGracePeriodSeconds: 30 s by default), then sends SIGKILL. A strategy opts into an emergency
save when its ``saves_on_sigterm()`` is true: by default, when the scenario sets the option
``save_on_sigterm: true`` (the built-in torch strategies declare it); a plug-in may override the
method. Its rank processes then get a SIGTERM handler. Without one, SIGTERM ends a rank at once,
wherever it is.

The handler only records that the signal came. A Python handler runs between bytecodes of the main
thread: never while its rank waits inside a C++ collective (so ranks notice at different steps, and a
rank nobody signalled does not notice at all), and a save from inside it could catch the model half
way through an optimizer step. Instead, between steps, every rank all-reduces the flag (MAX): all of
them stop after the same step, save it with the strategy's own ``save`` (unless that step's regular
save just returned), and end by SIGTERM's default action. The save is reported like any other
(``save_begin`` / ``save_returned`` with ``emergency: true``): once it has returned on every rank it
is a checkpoint the restart must not lose.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from .events import Event

_received_at: float | None = None


def sigterm_received() -> bool:
    """Whether this process's emergency-save handler has seen SIGTERM."""
    return _received_at is not None


def _on_sigterm(signum: int, frame: Any) -> None:
    global _received_at
    if _received_at is None:
        _received_at = time.time()


def wanted_by(strategy: Any) -> bool:
    """Whether ``strategy`` (a `CheckpointStrategy`) asks for an emergency save on SIGTERM: its
    declared ``saves_on_sigterm()``. Called by the rank worker, after the restore."""
    return bool(strategy.saves_on_sigterm())


class EmergencySave:
    """Installed in a rank process whose strategy wants it; see the module docstring."""

    def __init__(self, emit: Callable[..., None]):
        self.emit = emit
        signal.signal(signal.SIGTERM, _on_sigterm)

    def requested(self) -> bool:
        """Collective, on every rank between steps: whether any rank has seen SIGTERM."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if sigterm_received() else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def stop(self, step: int, save: Callable[[], None] | None) -> NoReturn:
        """Save ``step`` with ``save`` (None: the regular save of this step already returned), then
        end as SIGTERM's default action would have."""
        self.emit(Event.PREEMPTED, step=step, sigterm_at=_received_at, signalled=sigterm_received(),
                  emergency_save=save is not None)
        if save is not None:
            self.emit(Event.SAVE_BEGIN, step=step, emergency=True)
            save()
            self.emit(Event.SAVE_RETURNED, step=step, emergency=True)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # not reached: the default action ends the process
        os._exit(128 + signal.SIGTERM)
