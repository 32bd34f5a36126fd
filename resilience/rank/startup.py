"""What every rank process does first and last, once for all its entry points (`worker.main`,
`checkpoint_check.main`, `warm_rank.serve`, `elastic_entry`'s rank, `blackbox_hook`'s script rank):

- first `begin_rank`: the process dies with its parent (no rank outlives the run) and dumps every
  thread's Python stack on SIGUSR1 (the supervisor's HANG report, `run.supervisor.supervise`);
- around its work `run_reporting`: whatever it raises (SystemExit included) is reported once as
  the verdict's evidence (`report_failure`: an ``error`` event and stderr), then the process ends
  at once with status 1, without waiting for peers stuck in a collective;
- at its end `exit_now`: no interpreter finalization.

The standard library and this package's core only, so a process can take it before it imports torch.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..core.events import Event, EventLog
from ..core.processes import die_with_parent

REPORTED = "reported_as_evidence"  # set on an exception once its error event is written


def begin_rank(stacks: TextIO | None = None) -> None:
    """The first thing a rank process does: `die_with_parent`, and every thread's stack to
    ``stacks`` (default stderr) on SIGUSR1. The file must stay open for the process's life."""
    die_with_parent()
    faulthandler.register(signal.SIGUSR1, file=stacks or sys.stderr, all_threads=True)


def run_reporting(events: EventLog, work: Callable[[], Any]) -> int:
    """``work()``, and 0; any exception it raises reported (`report_failure`), then ``os._exit(1)``."""
    try:
        work()
    except BaseException as exc:  # every failure, SystemExit included, is evidence for the verdict
        report_failure(events, exc)
        os._exit(1)  # peers may be stuck in a collective: do not wait for a clean shutdown
    return 0


def report_failure(events: EventLog, exc: BaseException) -> None:
    """The rank's error as the verdict's evidence (event log) and for people (stderr), once per
    exception (``run`` reports before its exit handlers; its caller reports whatever it raises)."""
    if getattr(exc, REPORTED, False):
        return
    try:
        setattr(exc, REPORTED, True)
    except AttributeError:  # an exception type without attributes of its own: reported again at worst
        pass
    events.emit(Event.ERROR, type=type(exc).__name__, message=str(exc)[:4000], chain=exception_chain(exc),
                traceback=traceback.format_exc()[-8000:])
    traceback.print_exc()
    sys.stderr.flush()


def exception_chain(exc: BaseException) -> list[str]:
    """'Type: message' of the causes and contexts under ``exc`` (torch.save, for one, reports an
    ENOSPC from a file object's write as a RuntimeError whose context is the OSError)."""
    chain, seen = [], {id(exc)}
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen and len(chain) < 8:
        seen.add(id(current))
        chain.append(f"{type(current).__name__}: {str(current)[:1000]}")
        current = current.__cause__ or current.__context__
    return chain


def redirect_output(log_paths: tuple[Path, Path]) -> None:
    """From now on this process's stdout and stderr (file descriptors 1 and 2, so native code's
    output too) append to ``log_paths``, as a rank started with its logs does."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, path in zip((1, 2), log_paths, strict=True):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)


def exit_now(code: int) -> None:
    """End a spawned rank as a forked one ends: without interpreter finalization. A process group
    some object still holds is then destroyed during finalization, and gloo's threads trying to
    take the GIL abort the process ("terminate called without an active exception", seen once in
    a few hundred spawned ranks under load): a crash after the rank's work was done and reported."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
