"""In-process IO interception: files a rank writes under the checkpoint directory go through
`InterceptedFile`, which lets fault listeners act at exact byte offsets with real effects on disk.

Installed in a rank process before any checkpoint code runs. It reaches ``open``/``io.open``,
``torch.save`` given a path (torch would otherwise write from C++, unseen), safetensors'
``save_file`` (Rust, unseen otherwise: Accelerate's ``model.safetensors``), and ``os.fsync``.
A file is wrapped only while some listener wants it; the cost then is one Python call per
``write``, and otherwise nothing: the strategy's own IO path stays what it is in production.
"""
from __future__ import annotations

import builtins
import io
import os
import sys
import weakref
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

WRITE_MODE_CHARS = set("wax+")
#: how a file in the rank's temporary directory ($TMPDIR, where Lightning's atomic save stages its
#: file before moving it into place) is named to listeners and fault globs: "$TMPDIR/<name>"
STAGING_PREFIX = "$TMPDIR/"


class IOListener(Protocol):
    """Hooks called on files under the checkpoint directory, in this order per file:
    ``wants(relative_path)`` as the file is opened (optional, default yes: see `ChoosesFiles`; a
    file no listener wants is not wrapped, and ``torch.save`` then writes it from C++ as it would
    without the harness); ``on_open`` once; ``on_write`` before each write (it may write a prefix
    itself through ``file.write_through`` and then raise or end the process); ``on_fsync`` before
    each fsync; ``before_close`` then ``after_close`` once. A fault is one through
    `resilience.faults.base.WriteListener`."""

    def on_open(self, file: "InterceptedFile") -> None: ...
    def on_write(self, file: "InterceptedFile", data: Any, nbytes: int) -> None: ...
    def on_fsync(self, file: "InterceptedFile") -> None: ...
    def before_close(self, file: "InterceptedFile") -> None: ...
    def after_close(self, file: "InterceptedFile") -> None: ...


@runtime_checkable
class ChoosesFiles(Protocol):
    """An `IOListener` that chooses the files it sees (one without ``wants`` sees every file)."""

    def wants(self, relative: str) -> bool: ...


class InterceptedFile:
    """A writable file object that reports every write, fsync and close to the listeners."""

    def __init__(self, raw: Any, path: Path, relative: str, listeners: Sequence[IOListener], registry: dict):
        self._raw, self.path, self.relative = raw, path, relative
        self._listeners, self._registry = listeners, registry
        self.offset = raw.tell() if raw.seekable() else 0
        self.closed_by_us = False
        try:
            self._fd = raw.fileno()
            registry[self._fd] = self
        except (OSError, io.UnsupportedOperation):
            self._fd = None
        for listener in listeners:
            listener.on_open(self)

    # -- writing ----------------------------------------------------------------------------------
    def write(self, data: Any) -> int:
        nbytes = len(data.encode()) if isinstance(data, str) else memoryview(data).nbytes
        for listener in self._listeners:
            listener.on_write(self, data, nbytes)
        return self.write_through(data)

    def write_through(self, data: Any) -> int:
        """Write without consulting listeners (a listener uses it to write a prefix)."""
        written = self._raw.write(data)
        self.offset += len(data.encode()) if isinstance(data, str) else (written or 0)
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush_to_os(self) -> None:
        """Hand everything buffered to the kernel: a SIGKILL after this keeps it on disk."""
        self._raw.flush()

    def truncate_to(self, size: int) -> None:
        self._raw.flush()
        if self._fd is not None:
            os.ftruncate(self._fd, size)

    def fsync(self) -> None:
        for listener in self._listeners:
            listener.on_fsync(self)

    def close(self) -> None:
        if self._raw.closed:
            return
        try:
            for listener in self._listeners:
                listener.before_close(self)
        finally:
            if self._fd is not None:
                self._registry.pop(self._fd, None)
            self._raw.close()
        for listener in self._listeners:
            listener.after_close(self)

    # -- file protocol ----------------------------------------------------------------------------
    def __enter__(self) -> "InterceptedFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self):
        return iter(self._raw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _relative_inside(path: str, root: Path) -> str | None:
    try:
        relative = os.path.relpath(path, root)
    except ValueError:
        return None
    if relative in (".", os.pardir) or relative.startswith(os.pardir + os.sep):  # not "..name"
        return None
    return relative.replace(os.sep, "/")


class Interceptor:
    """Routes writes under ``root`` through `InterceptedFile`. One per rank process."""

    def __init__(self, root: Path, listeners: Sequence[IOListener], staging: Path | None = None):
        self.root = Path(os.path.abspath(root))
        self.staging = Path(os.path.abspath(staging)) if staging is not None else None
        self.listeners = list(listeners)
        # Weak: a file dropped without close() must be collected, flushed and closed as it would be
        # without interception (``json.dump(x, open(p, 'w'))``), not kept open and unflushed.
        self.open_files: weakref.WeakValueDictionary[int, InterceptedFile] = weakref.WeakValueDictionary()
        self._saved: list[tuple[Any, str, Any]] = []

    def interested(self, file: Any) -> tuple[str | None, list]:
        """The file's path relative to the root and the listeners that want it."""
        relative = self.relative(file)
        if relative is None:
            return None, []
        return relative, [listener for listener in self.listeners
                          if not isinstance(listener, ChoosesFiles) or listener.wants(relative)]

    def relative(self, file: Any) -> str | None:
        """The name listeners see: relative to the checkpoint directory, or ``$TMPDIR/...`` for a
        file staged in the rank's temporary directory; None for any other file."""
        if not isinstance(file, (str, bytes, os.PathLike)):
            return None
        path = os.path.abspath(os.fsdecode(file))
        inside = _relative_inside(path, self.root)
        if inside is None and self.staging is not None:
            staged = _relative_inside(path, self.staging)
            return None if staged is None else STAGING_PREFIX + staged
        return inside

    def install(self) -> None:
        import torch
        import torch.serialization

        real_open, real_save, real_fsync = builtins.open, torch.serialization.save, os.fsync

        def intercepted_open(file, mode="r", *args, **kwargs):
            raw = real_open(file, mode, *args, **kwargs)
            relative, listeners = self.interested(file) if WRITE_MODE_CHARS & set(mode) else (None, [])
            if not listeners:
                return raw
            return InterceptedFile(raw, Path(os.fsdecode(file)), relative, listeners, self.open_files)

        def intercepted_save(obj, f, *args, **kwargs):
            relative, listeners = self.interested(f)
            if not listeners:
                return real_save(obj, f, *args, **kwargs)
            with InterceptedFile(real_open(f, "wb"), Path(os.fsdecode(f)), relative, listeners,
                                 self.open_files) as handle:
                return real_save(obj, handle, *args, **kwargs)

        def intercepted_fsync(fd):
            number = fd if isinstance(fd, int) else fd.fileno()
            file = self.open_files.get(number)
            if file is not None:
                file.fsync()
            return real_fsync(fd)

        replacements = [(builtins, "open", intercepted_open), (io, "open", intercepted_open),
                        (torch, "save", intercepted_save), (torch.serialization, "save", intercepted_save),
                        (os, "fsync", intercepted_fsync)]
        replacements += self._safetensors_replacements(real_open)
        for owner, name, new in replacements:
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, new)

    def _safetensors_replacements(self, real_open: Any) -> list[tuple[Any, str, Any]]:
        """``safetensors.torch.save_file`` writes from Rust, unseen: a file a listener wants is
        serialised with ``safetensors.torch.save`` (the same bytes) and written through an
        `InterceptedFile`. Accelerate and Transformers bind ``save_file`` at their import as
        ``safe_save_file`` (``model.safetensors``): those names are replaced too."""
        try:
            import safetensors.torch as safetensors_torch
        except ImportError:
            return []
        real_save_file = safetensors_torch.save_file

        def intercepted_save_file(tensors, filename, metadata=None):
            relative, listeners = self.interested(filename)
            if not listeners:
                return real_save_file(tensors, filename, metadata=metadata)
            data = safetensors_torch.save(tensors, metadata=metadata)
            with InterceptedFile(real_open(filename, "wb"), Path(os.fsdecode(filename)), relative, listeners,
                                 self.open_files) as handle:
                handle.write(data)
            return None

        replacements = [(safetensors_torch, "save_file", intercepted_save_file)]
        for binder in ("accelerate.utils.other", "transformers.modeling_utils"):
            bound = sys.modules.get(binder)
            if bound is not None and getattr(bound, "safe_save_file", None) is real_save_file:
                replacements.append((bound, "safe_save_file", intercepted_save_file))
        return replacements

    def uninstall(self) -> None:
        while self._saved:
            owner, name, old = self._saved.pop()
            setattr(owner, name, old)
