"""Where a rank works, and what a restoring rank must not read: every phase's ranks run in a
working directory of their own (``<phase dir>/work``), so nothing the first run left in its working
directory is in reach of a relative path, and a rank that restores reports every file it opens
under the first run's phase directory (``PhasePlan.foreign_roots``): a checkpoint that needs
anything beside itself is not one a fresh node can restore."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.events import Event

WORK_DIR = "work"


def enter_working_dir(phase_dir: Path) -> Path:
    """Make ``<phase_dir>/work`` this process's working directory; an empty entry of
    ``sys.path`` (the old working directory) is pinned to that directory first, so imports keep
    resolving where they did."""
    previous = os.getcwd()
    sys.path[:] = [entry or previous for entry in sys.path]
    work = Path(phase_dir) / WORK_DIR
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    return work


class _Watch:
    """The one audit hook of this process (a hook cannot be removed: a warm rank that restores
    many times points it at each restore's roots and events in turn)."""

    prefixes: tuple[str, ...] = ()
    emit: Callable[..., None] | None = None
    seen: set[str] = set()
    installed = False

    @classmethod
    def hook(cls, event: str, args: tuple[Any, ...]) -> None:
        if not cls.prefixes or event not in ("open", "os.listdir", "os.scandir") or not args:
            return
        try:
            target = args[0]
            if target is None or isinstance(target, int):
                return  # a file descriptor: its path was seen when it was opened
            path = os.path.abspath(os.fsdecode(target))
            if path in cls.seen or not any(path == p or path.startswith(p + os.sep) for p in cls.prefixes):
                return
            cls.seen.add(path)
            cls.emit(Event.FOREIGN_READ, path=path, how=event)
        except Exception:  # noqa: BLE001 -- a hook that raises would fail the open it watches
            return


def watch_foreign_reads(roots: tuple[str, ...], emit: Callable[..., None]) -> None:
    """Emit ``foreign_read`` (path, how) once per path this process opens or lists under one of
    ``roots`` (none: stop watching). A Python audit hook: it sees ``open``, ``os.open``,
    ``os.listdir`` and ``os.scandir`` from Python and from libraries that call them (torch.load of
    a path, json, pickle), not files native code opens itself (a Rust or C++ reader's own
    ``open(2)``)."""
    _Watch.prefixes, _Watch.emit, _Watch.seen = tuple(os.path.abspath(r) for r in roots), emit, set()
    if _Watch.prefixes and not _Watch.installed:
        sys.addaudithook(_Watch.hook)
        _Watch.installed = True
