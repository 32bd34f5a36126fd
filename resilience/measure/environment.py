"""What a qualification ran on: library and kernel versions, and the checkpoint filesystem.

A reviewer trusts a verdict only on the stack it was measured on, so the report records it.
"""
from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
LIBRARIES = ("numpy", "s3fs", "boto3")  # beside what each stack names (`strategies.stack.distributions`)


@dataclass(frozen=True)
class Mount:
    """The mount a path lives on, from /proc/self/mountinfo."""

    mount_point: str
    fs_type: str
    source: str
    options: str  # per-mount options, then the superblock's (e.g. "rw,relatime | rw,size=...")


@dataclass(frozen=True)
class ObjectStoreTarget:
    """An S3 store checkpoints went to, in place of a directory (``qualify --workdir s3://...``)."""

    endpoint: str
    bucket: str
    prefix: str
    server: str  # what the server calls itself (its Server header)


@dataclass(frozen=True)
class Environment:
    python: str
    libraries: dict[str, str | None]  # None: not installed
    kernel: str
    machine: str
    cpus: int
    checkpoint_dir: str  # or the store's s3:// URL
    mount: Mount | None
    object_store: ObjectStoreTarget | None = None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mountinfo(text: str) -> list[Mount]:
    """Each line: id parent major:minor root mount_point options [optional...] - fstype source super_options."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 2:
            continue
        super_options = tail[2] if len(tail) > 2 else ""
        mounts.append(Mount(mount_point=_unescape(fields[4]), fs_type=tail[0], source=_unescape(tail[1]),
                            options=f"{fields[5]} | {super_options}" if super_options else fields[5]))
    return mounts


def mount_of(path: Path, mountinfo: str | None = None) -> Mount | None:
    """The mount holding ``path``: the longest mount point that contains it (the last one mounted wins)."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError:
            return None
    resolved = os.path.realpath(path)
    best: Mount | None = None
    for mount in parse_mountinfo(mountinfo):
        point = mount.mount_point.rstrip("/") or "/"
        inside = resolved == point or resolved.startswith(point + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    return best


def library_versions() -> dict[str, str | None]:
    from ..strategies.stack import distributions

    versions: dict[str, str | None] = {}
    for name in (*distributions(), *LIBRARIES):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def describe(checkpoint_dir: Path | str, object_store: ObjectStoreTarget | None = None) -> Environment:
    """``checkpoint_dir``: a directory, or with ``object_store`` the store's URL."""
    uname = platform.uname()
    return Environment(python=sys.version.split()[0], libraries=library_versions(),
                       kernel=f"{uname.system} {uname.release} {uname.version}", machine=uname.machine,
                       cpus=os.cpu_count() or 0, checkpoint_dir=str(checkpoint_dir),
                       mount=None if str(checkpoint_dir).startswith("s3://") else mount_of(checkpoint_dir),
                       object_store=object_store)
