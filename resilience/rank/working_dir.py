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
from ..core.file_comparison import comparison_of

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


# audit events whose path arguments a restore's outcome may depend on (`observe_paths`), and on
# what of each: its bytes (read), its kind (kind: file, directory or none), whether it is a
# directory (dir: a truncating open that creates what is missing), its kind and size
# (stat), its bytes or entries (change), its entries' names (list), their names and kinds (scan), or
# everything under it (tree); one entry per path argument
OBSERVED_HOW = {"os.listdir": ("list",), "os.scandir": ("scan",), "os.rename": ("change", "change"),
                "os.remove": ("kind",), "os.rmdir": ("change",), "os.mkdir": ("kind",), "shutil.rmtree": ("tree",),
                "os.truncate": ("kind",), "os.link": ("read", "kind"), "os.symlink": ("kind", "kind"),
                "shutil.copyfile": ("read", "kind"), "os.chmod": ("kind",), "os.utime": ("kind",)}
_CREATE_OR_TRUNCATE = os.O_CREAT | os.O_TRUNC  # an open that reads nothing of what was there, and fails
# only where a directory is in the way (an exclusive create or a bare truncation: where a file is, or is not)
_UNAUDITED = {name: getattr(os, name) for name in ("stat", "lstat", "access")}  # as Python started them


class _Watch:
    """The one audit hook of this process (a hook cannot be removed: a warm rank that restores
    many times points it at each restore's roots and events in turn)."""

    prefixes: tuple[str, ...] = ()
    emit: Callable[..., None] | None = None
    seen: set[str] = set()
    observed_root: str | None = None  # `observe_paths`: the checkpoint directory
    observe: Callable[..., None] | None = None
    observed: set[tuple[str, str]] = set()
    installed = False

    @classmethod
    def hook(cls, event: str, args: tuple[Any, ...]) -> None:
        if cls.observed_root is not None and (event == "open" or event in OBSERVED_HOW) and args:
            cls._observe(event, args)
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

    @classmethod
    def _observe(cls, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            cls._observe_open(*(args + (None, 0))[:3])
            return
        for target, how in zip(args, OBSERVED_HOW[event], strict=False):
            if isinstance(target, (str, bytes, os.PathLike)):  # not a descriptor: seen when it was opened
                cls.note(target, how)

    @classmethod
    def _observe_open(cls, target: Any, mode: str | None, flags: int | None) -> None:
        mode, flags = mode or "", flags or 0
        if "w" in mode or (flags & _CREATE_OR_TRUNCATE == _CREATE_OR_TRUNCATE and not flags & os.O_EXCL):
            cls.replaced(target)  # the one thing that can fail it: a directory in the way
        elif flags & os.O_TRUNC:
            cls.replaced(target, "kind")  # it fails where the file is missing (or, exclusive, where it is not)
        elif isinstance(target, (str, bytes, os.PathLike)):  # not a descriptor: seen when it was opened
            cls.note(target, "kind" if "x" in mode or flags & os.O_EXCL else "read")

    @classmethod
    def replaced(cls, target: Any, how: str = "dir") -> None:
        """``target`` is being truncated (and created if missing): looked at ``how`` (by default
        whether it is a directory), and reported replaced (a later look at it meets what the
        restore wrote, `disk.observed`)."""
        if isinstance(target, (str, bytes, os.PathLike)) and cls.note(target, how):
            cls.note(target, "replaced")

    @classmethod
    def note(cls, target: Any, how: str) -> bool:
        """Report the look once; whether ``target`` is under the observed root."""
        try:
            path = os.path.abspath(os.fsdecode(target))
        except Exception:  # noqa: BLE001 -- not a path: nothing under the root
            return False
        root = cls.observed_root
        if root is None or not (path == root or path.startswith(root + os.sep)):
            return False
        relative = os.path.relpath(path, root).replace(os.sep, "/")
        if how in ("stat", "read"):  # a file compared with a known one: only the comparison counts
            how = comparison_of(path) or how
        if (relative, how) not in cls.observed:
            cls.observed.add((relative, how))
            cls.observe(Event.PATH_OBSERVED, path=relative, how=how)
        return True


def observe_paths(root: str | None, emit: Callable[..., None]) -> None:
    """Emit ``path_observed`` (path relative to ``root``; how: `OBSERVED_HOW`, and read or kind for an open)
    once per path this process opens, lists, stats, renames, removes or creates under ``root``
    (None: stop): what a restore's outcome can depend on there, as far as Python sees it (the
    explorer's reduction, `resilience.disk.observed`). ``os.stat``, ``os.lstat`` and ``os.access``
    raise no audit event: they are wrapped while observing. Not seen: files native code opens
    itself, and operations relative to a directory descriptor (Python's own ``rmtree`` uses them
    inside the tree it names, which is observed whole)."""
    _Watch.observed_root = os.path.abspath(root) if root is not None else None
    _Watch.observe, _Watch.observed = emit, set()
    if root is not None:
        _install()
    for name, real in _UNAUDITED.items():
        setattr(os, name, real if root is None else _stat_observed(real, name))
    os.scandir = _REAL_SCANDIR if root is None else _scandir_observed


# the standard library's callers of os.stat that use only the kind of entry it finds: (function, module)
KIND_ONLY_CALLERS = {("exists", "genericpath"), ("isfile", "genericpath"), ("isdir", "genericpath"),
                     ("samefile", "genericpath"), ("lexists", "posixpath"), ("islink", "posixpath"),
                     ("_stat", "shutil"), ("exists", "pathlib"), ("is_dir", "pathlib"), ("is_file", "pathlib"),
                     ("is_symlink", "pathlib")}


class _ObservedStat:
    """An ``os.stat_result`` that notes which of its fields the caller reads: the type bits of
    ``st_mode`` tell the kind of entry; every other field counts as the size's level (stat)."""

    __slots__ = ("_real", "_path")

    def __init__(self, real: os.stat_result, path: Any):
        self._real, self._path = real, path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("st_"):
            _Watch.note(self._path, "kind" if name == "st_mode" else "stat")
        return getattr(self._real, name)

    def __getitem__(self, index: Any) -> Any:
        _Watch.note(self._path, "stat")
        return self._real[index]

    def __iter__(self):
        _Watch.note(self._path, "stat")
        return iter(self._real)

    def __len__(self) -> int:
        return len(self._real)

    def __eq__(self, other: Any) -> bool:
        _Watch.note(self._path, "stat")
        return self._real == (other._real if isinstance(other, _ObservedStat) else other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._real)


def _stat_observed(real: Callable[..., Any], name: str) -> Callable[..., Any]:
    def observed(path, *args, **kwargs):
        if isinstance(path, (str, bytes, os.PathLike)) and kwargs.get("dir_fd") is None and _Watch.note(path, "kind"):
            caller = sys._getframe(1)
            # noted: that it answered at all; its fields as they are read
            if not any(frame is not None and (frame.f_code.co_name, frame.f_globals.get("__name__"))
                       in KIND_ONLY_CALLERS for frame in (caller, caller.f_back)):
                result = real(path, *args, **kwargs)
                return result if name == "access" else _ObservedStat(result, path)
        return real(path, *args, **kwargs)

    return observed


_REAL_SCANDIR = os.scandir


def _scandir_observed(path=None):
    """``os.scandir`` whose entries note a ``stat()`` or ``inode()`` as a stat look: the scan itself
    (its audit event) is the names and kinds of the entries (``is_dir`` and the like)."""
    real = _REAL_SCANDIR() if path is None else _REAL_SCANDIR(path)
    return real if isinstance(path, int) else _ObservedScan(real)


class _ObservedScan:
    __slots__ = ("_real",)

    def __init__(self, real: Any):
        self._real = real

    def __iter__(self):
        return self

    def __next__(self) -> "_ObservedEntry":
        return _ObservedEntry(next(self._real))

    def __enter__(self) -> "_ObservedScan":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._real.close()

    def close(self) -> None:
        self._real.close()


class _ObservedEntry:
    __slots__ = ("_real",)

    def __init__(self, real: os.DirEntry):
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __fspath__(self) -> str:
        return self._real.__fspath__()

    def stat(self, *args: Any, **kwargs: Any) -> os.stat_result:
        _Watch.note(self._real.path, "stat")
        return self._real.stat(*args, **kwargs)

    def inode(self) -> int:
        _Watch.note(self._real.path, "stat")
        return self._real.inode()

    def __repr__(self) -> str:
        return repr(self._real)


def _install() -> None:
    if not _Watch.installed:
        sys.addaudithook(_Watch.hook)
        _watch_torch_save()
        _Watch.installed = True


def _watch_torch_save() -> None:
    """``torch.save`` given a path opens it from C++ ("wb", no audit event): it is noted here as the
    truncating open it is (for the process's life, as the hook; torch's own call does the rest)."""
    import torch
    import torch.serialization

    real = torch.serialization.save

    def save(obj, f, *args, **kwargs):
        if _Watch.observed_root is not None:
            _Watch.replaced(f)
        return real(obj, f, *args, **kwargs)

    torch.save = torch.serialization.save = save


def watch_foreign_reads(roots: tuple[str, ...], emit: Callable[..., None]) -> None:
    """Emit ``foreign_read`` (path, how) once per path this process opens or lists under one of
    ``roots`` (none: stop watching). A Python audit hook: it sees ``open``, ``os.open``,
    ``os.listdir`` and ``os.scandir`` from Python and from libraries that call them (torch.load of
    a path, json, pickle), not files native code opens itself (a Rust or C++ reader's own
    ``open(2)``)."""
    _Watch.prefixes, _Watch.emit, _Watch.seen = tuple(os.path.abspath(r) for r in roots), emit, set()
    if _Watch.prefixes:
        _install()
