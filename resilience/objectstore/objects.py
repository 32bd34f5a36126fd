"""Objects at rest, for the faults that damage a saved checkpoint: listing with an identity per
object, and rewriting one object whole (an object cannot be changed in place). Runs in ranks,
through fsspec (s3fs for ``s3://``), imported only when a case has an object store."""
from __future__ import annotations

from typing import Any, Callable


def object_identities(url: str) -> dict[str, tuple[Any, ...]]:
    """Every object under ``url``: key relative to it -> (ETag, size), listed afresh."""
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(url)
    fs.invalidate_cache()
    found = fs.find(root, detail=True)
    return {path[len(root):].lstrip("/"): (info.get("ETag"), info.get("size")) for path, info in found.items()}


def rewrite_object(url: str, relative: str, damaged: Callable[[bytes, str], tuple[bytes | None, Any]]) -> Any:
    """Replace the object ``relative`` under ``url`` by ``damaged(its bytes, its URL)[0]`` (None: delete it);
    returns what ``damaged`` said it did."""
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(url)
    key = f"{root}/{relative}"
    new, detail = damaged(fs.cat_file(key), f"{url}/{relative}")
    if new is None:
        fs.rm_file(key)
    else:
        fs.pipe_file(key, new)
    return detail


def copy_object(url: str, source: str, target: str) -> None:
    """The object ``source`` under ``url`` copied over ``target`` (a server-side copy: a whole new object)."""
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(url)
    fs.copy(f"{root}/{source}", f"{root}/{target}")
