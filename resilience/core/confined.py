"""Paths a scenario names, kept inside the directory they belong to.

A scenario is data: whatever its globs say, the harness writes and deletes only under the case's
work directory and the checkpoint directory. The loader refuses patterns that point elsewhere
(`relative_glob_problem`); whatever resolves a match re-checks it on disk (`resolve_under`), since a
strategy or a library may have left a symlink that points out.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import PathEscape

RELATIVE_GLOB = "a glob relative to the checkpoint directory, e.g. '*_rank_1.pt' or 'step_*/latest'"


def relative_glob_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot name files under a directory, or None when it can."""
    if "\0" in pattern:
        return "holds a NUL byte"
    if pattern.startswith(("/", "~")):
        return "is absolute (starts with / or ~)"
    if ".." in pattern.split("/"):
        return "climbs out of the directory with a '..' component"
    return None


def resolve_under(root: Path, relative: str) -> Path:
    """``root / relative`` once it is known to land inside ``root`` with every symlink resolved;
    `PathEscape` otherwise. The path comes back as named, so an unlink removes a link, not its target."""
    base = Path(root).resolve()
    landing = (base / relative).resolve()
    if not landing.is_relative_to(base):
        raise PathEscape(f"{relative!r} under {root} resolves to {landing}, outside that directory; "
                         "refusing to touch it")
    return Path(root) / relative
