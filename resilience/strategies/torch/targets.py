"""Where the torch schemes and ``manifest`` keep their files: a local directory (`DirectoryTarget`,
what they always did) or the objects under an fsspec URL (`ObjectTarget`: ``s3://bucket/prefix``
through s3fs, with ``object_store: s3``).

A location is a ``Path`` on a directory and a ``str`` URL on objects. No method is collective:
each is called by the rank that needs it. On objects there is no directory to create or fsync, a
``torch.save`` streams into an upload that appears only when it completes (one PUT below the part
size, a multipart upload above it), and a small document written whole is one PUT, which is
atomic where a rename (a copy, then a delete) is not. s3fs is imported only on first use, in ranks.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch

from ...core.durable import fsync_directory, write_atomically

CHUNK = 1 << 20


def stream_digest(file, durable: bool = False) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    while chunk := file.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    if durable:
        os.fsync(file.fileno())
    return size, digest.hexdigest()


class CheckpointTarget(ABC):
    """The file operations the torch schemes and ``manifest`` make, on one root."""

    root: Path | str

    @abstractmethod
    def join(self, location: Path | str, *names: str) -> Path | str: ...

    @abstractmethod
    def relative(self, location: Path | str) -> str:
        """``location`` relative to the root, with ``/``."""

    @abstractmethod
    def entries(self, directory: Path | str) -> list[str]:
        """Names directly under ``directory`` that hold something (none if it does not exist)."""

    @abstractmethod
    def files_under(self, location: Path | str) -> list[str]:
        """Every file under ``location``, relative to it, sorted."""

    @abstractmethod
    def make_directory(self, location: Path | str) -> None:
        """``location`` exists as a directory (parents too; nothing to make on objects)."""

    @abstractmethod
    def save(self, state: Any, path: Path | str) -> None:
        """``torch.save`` of ``state`` into ``path``, whose directory exists."""

    @abstractmethod
    def load(self, path: Path | str) -> Any:
        """``torch.load(..., weights_only=True)`` of ``path``."""

    @abstractmethod
    def digest(self, path: Path | str, durable: bool = False) -> tuple[int, str]:
        """(size, sha256); ``durable``: what was hashed is made durable too."""

    @abstractmethod
    def size(self, path: Path | str) -> int: ...

    @abstractmethod
    def read_text(self, path: Path | str) -> str: ...

    @abstractmethod
    def write_document(self, path: Path | str, text: str) -> None:
        """Write ``text`` so that ``path`` is old or new after a crash, never torn; its directory
        is made (and made durable) first."""

    @abstractmethod
    def remove(self, path: Path | str) -> None: ...

    @abstractmethod
    def remove_tree(self, location: Path | str) -> None: ...

    @abstractmethod
    def make_durable(self, location: Path | str) -> None:
        """The names under ``location`` survive a crash (a directory fsync; nothing on objects)."""


class DirectoryTarget(CheckpointTarget):
    def __init__(self, root: Path):
        self.root = root

    def join(self, location, *names):
        return Path(location).joinpath(*names)

    def relative(self, location):
        return Path(location).relative_to(self.root).as_posix()

    def entries(self, directory):
        directory = Path(directory)
        return [p.name for p in directory.iterdir()] if directory.is_dir() else []

    def files_under(self, location):
        return sorted(p.relative_to(location).as_posix() for p in Path(location).rglob("*") if p.is_file())

    def make_directory(self, location):
        Path(location).mkdir(parents=True, exist_ok=True)

    def save(self, state, path):
        torch.save(state, path)  # a path: the interception faults see it through torch.save

    def load(self, path):
        return torch.load(path, weights_only=True)

    def digest(self, path, durable=False):
        with open(path, "rb") as file:
            return stream_digest(file, durable)

    def size(self, path):
        return Path(path).stat().st_size

    def read_text(self, path):
        return Path(path).read_text(encoding="utf-8")

    def write_document(self, path, text):
        path = Path(path)
        if not path.parent.is_dir():
            path.parent.mkdir()
            fsync_directory(path.parent.parent)
        write_atomically(path, text)

    def remove(self, path):
        Path(path).unlink()
        fsync_directory(Path(path).parent)

    def remove_tree(self, location):
        shutil.rmtree(location, ignore_errors=True)

    def make_durable(self, location):
        fsync_directory(Path(location))


class ObjectTarget(CheckpointTarget):
    """``part_size``: s3fs's block size (its default: 50 MiB); a file above it goes up as a
    multipart upload of parts that size."""

    def __init__(self, url: str, part_size: int | None = None):
        self.root = url.rstrip("/")
        self.part_size = part_size
        self._fs = None

    @property
    def fs(self):
        if self._fs is None:
            from fsspec.core import url_to_fs

            self._fs, _ = url_to_fs(self.root)
        return self._fs

    def _key(self, url: str) -> str:
        return self.fs._strip_protocol(url)

    def join(self, location, *names):
        return "/".join([str(location).rstrip("/"), *names])

    def relative(self, location):
        return str(location)[len(self.root):].lstrip("/")

    def entries(self, directory):
        try:  # listed afresh: another rank may have written since
            found = self.fs.ls(self._key(directory), detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return [path.rstrip("/").rsplit("/", 1)[-1] for path in found]

    def files_under(self, location):
        key = self._key(location).rstrip("/")
        self.fs.invalidate_cache()
        return sorted(path[len(key):].lstrip("/") for path in self.fs.find(key))

    def make_directory(self, location):
        pass

    def save(self, state, path):
        options = {"block_size": self.part_size} if self.part_size else {}
        with self.fs.open(self._key(path), "wb", **options) as file:
            torch.save(state, file)  # streamed: the object appears when the upload completes

    def load(self, path):
        with self.fs.open(self._key(path), "rb") as file:
            return torch.load(file, weights_only=True)

    def digest(self, path, durable=False):
        with self.fs.open(self._key(path), "rb") as file:  # an object is durable once its PUT returned
            return stream_digest(file)

    def size(self, path):
        return self.fs.info(self._key(path), refresh=True)["size"]

    def read_text(self, path):
        return self.fs.cat_file(self._key(path)).decode("utf-8")

    def write_document(self, path, text):
        self.fs.pipe_file(self._key(path), text.encode("utf-8"))  # one PUT: the object appears whole

    def remove(self, path):
        self.fs.rm_file(self._key(path))

    def remove_tree(self, location):
        try:
            self.fs.rm(self._key(location), recursive=True)
        except FileNotFoundError:
            pass

    def make_durable(self, location):
        pass


def target_of(checkpoint_dir: Path, checkpoint_url: str | None, part_size: int | None = None) -> CheckpointTarget:
    """The target a strategy context names: its object store's URL when it has one."""
    return ObjectTarget(checkpoint_url, part_size) if checkpoint_url else DirectoryTarget(checkpoint_dir)
