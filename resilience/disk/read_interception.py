"""In-process interception of reads under the checkpoint directory, the read-side twin of
`resilience.disk.interception`: files a rank opens for reading go through `InterceptedReader`, so a
fault can fail the open, fail a read, or slow reads down, with the bytes coming from the real file.

What it reaches: ``open``/``io.open`` in read mode, and so ``torch.load`` given a path (torch opens
it with Python's ``open`` and its C++ zip reader pulls the bytes through the file object's
``readinto``/``read``, see ``BufferAdapter``), DeepSpeed's ``torch.load`` of its shards and its
``open(latest).read()``. What it does not reach: pages of a file mapped with
``torch.load(..., mmap=True)`` (``UntypedStorage.from_file`` maps it in C++ after torch read the
zip directory through the file object): such a load is still seen at its open and directory
reads, never page by page. Write interception stays in `resilience.disk.interception`; both can be
installed in one process, in either order.
"""
from __future__ import annotations

import builtins
import io
import os
from pathlib import Path
from typing import Any, Protocol, Sequence

from .interception import WRITE_MODE_CHARS


class ReadListener(Protocol):
    """Hooks called on files opened for reading under the checkpoint directory, in this order per
    file: ``wants_read(relative_path)`` as it is opened (a file no listener wants is not wrapped);
    ``on_open_read(path, relative)`` once, before the real open (it may raise, as a failing
    filesystem does at open); ``on_read(file, nbytes)`` before each read of up to ``nbytes``
    (-1: to the end) (it may raise or sleep)."""

    def wants_read(self, relative: str) -> bool: ...
    def on_open_read(self, path: Path, relative: str) -> None: ...
    def on_read(self, file: "InterceptedReader", nbytes: int) -> None: ...


class InterceptedReader:
    """A readable file object that reports every read to the listeners before doing it."""

    def __init__(self, raw: Any, path: Path, relative: str, listeners: Sequence[ReadListener]):
        self._raw, self.path, self.relative, self._listeners = raw, path, relative, listeners
        self.bytes_read = 0

    def _before(self, nbytes: int) -> None:
        for listener in self._listeners:
            listener.on_read(self, nbytes)

    def read(self, size: int = -1) -> Any:
        self._before(size if size is not None else -1)
        data = self._raw.read(size)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        self._before(memoryview(buffer).nbytes)
        count = self._raw.readinto(buffer)
        self.bytes_read += count or 0
        return count

    def readline(self, size: int = -1) -> Any:
        self._before(size if size is not None else -1)
        line = self._raw.readline(size)
        self.bytes_read += len(line)
        return line

    def readlines(self, hint: int = -1) -> list:
        return list(self)

    def __iter__(self):
        return iter(self.readline, "" if isinstance(self._raw, io.TextIOBase) else b"")

    def __enter__(self) -> "InterceptedReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._raw.close()

    def __getattr__(self, name: str) -> Any:  # seek, tell, close, fileno, name, mode, ...
        return getattr(self._raw, name)


class ReadInterceptor:
    """Routes reads under ``root`` through `InterceptedReader`. One per rank process."""

    def __init__(self, root: Path, listeners: Sequence[ReadListener]):
        self.root = Path(os.path.abspath(root))
        self.listeners = list(listeners)
        self._saved: list[tuple[Any, str, Any]] = []

    def relative(self, file: Any) -> str | None:
        if not isinstance(file, (str, bytes, os.PathLike)):
            return None
        relative = os.path.relpath(os.path.abspath(os.fsdecode(file)), self.root)
        if relative in (".", os.pardir) or relative.startswith(os.pardir + os.sep):
            return None
        return relative.replace(os.sep, "/")

    def install(self) -> None:
        real_open = builtins.open

        def intercepted_open(file, mode="r", *args, **kwargs):
            relative = None if WRITE_MODE_CHARS & set(mode) else self.relative(file)
            listeners = [listener for listener in self.listeners
                         if relative is not None and listener.wants_read(relative)]
            if not listeners:
                return real_open(file, mode, *args, **kwargs)
            path = Path(os.fsdecode(file))
            for listener in listeners:
                listener.on_open_read(path, relative)
            return InterceptedReader(real_open(file, mode, *args, **kwargs), path, relative, listeners)

        for owner, name in ((builtins, "open"), (io, "open")):
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, intercepted_open)

    def uninstall(self) -> None:
        while self._saved:
            owner, name, old = self._saved.pop()
            setattr(owner, name, old)


class ReadCounter:
    """A `ReadListener` that only counts: ``total`` is the bytes read so far through every file it
    was offered (opened for reading under the interceptor's root)."""

    def __init__(self) -> None:
        self._files: dict[int, InterceptedReader] = {}

    @property
    def total(self) -> int:
        return sum(file.bytes_read for file in self._files.values())

    def wants_read(self, relative: str) -> bool:
        return True

    def on_open_read(self, path: Path, relative: str) -> None:
        pass

    def on_read(self, file: InterceptedReader, nbytes: int) -> None:
        self._files.setdefault(id(file), file)
