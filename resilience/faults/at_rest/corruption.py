"""Damage to a checkpoint that was saved completely: what bad disks, bad copies and bad operators
do to files at rest (a flipped bit, a cut file, a zeroed block, a lost or misplaced shard, a stale
or dangling ``latest`` pointer).

The trigger and the stop are those of every damage at rest (`damage.DamageAfterSave`): right after
the ``step`` save returned everywhere, the trigger rank damages every file matching ``file`` that
was written during that save, then dies, so the restart restores from the damaged checkpoint, as
``version_mismatch`` does. The files are changed on disk with plain file operations: the restart
reads what a real damaged file holds.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from .damage import DamageAfterSave

MIDDLE = "middle"


def _offset_problem(key: str, value: Any) -> tuple[str, str, Any, Any] | None:
    if value == MIDDLE or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return (f"fault.{key}", "must be a byte offset or middle", value, "an integer >= 0, or middle (of the file)")


def _resolve_offset(offset: Any, size: int, name: Any) -> int:
    at = size // 2 if offset == MIDDLE else offset
    if at >= size:
        raise ValueError(f"fault offset {at} is past the end of {name} ({size} bytes)")
    return at


class RewritesBytes(DamageAfterSave):
    """A damage that is a function of a file's bytes (``damaged``: new bytes or None to delete,
    and what it did), applied in place to files and as a whole new object to objects."""

    on_objects = True
    detail_key: ClassVar[str] = ""

    def damaged(self, data: bytes, name: Any) -> tuple[bytes | None, Any]:
        raise NotImplementedError

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        done = []
        for path in paths:
            new, detail = self.damaged(path.read_bytes(), path)
            if new is None:
                path.unlink()
            else:
                with open(path, "r+b") as file:  # the same inode, as a bad disk leaves it
                    file.write(new)
                    file.truncate(len(new))
            done.append(detail)
        return self.summary(done)

    def damage_objects(self, relatives: list[str]) -> dict[str, Any]:
        from ...objectstore.objects import rewrite_object

        return self.summary([rewrite_object(self.env.checkpoint_url, r, self.damaged) for r in relatives])

    def summary(self, done: list[Any]) -> dict[str, Any]:
        return {self.detail_key: done} if self.detail_key else {}


class BitFlip(RewritesBytes):
    """One bit (``bit``, 0 = least significant) of the byte at ``offset`` (or the middle of the
    file) flipped in every matching file, as a bad disk or DRAM on a storage server does."""

    kind = "bit_flip"
    params = {"offset": (object, MIDDLE), "bit": (object, 0)}
    detail_key = "offsets"

    @classmethod
    def check(cls, spec):
        bit = spec.params.get("bit")
        if isinstance(bit, bool) or not isinstance(bit, int) or not 0 <= bit <= 7:
            return ("fault.bit", "must be a bit number", bit, "0..7")
        return _offset_problem("offset", spec.params.get("offset"))

    def damaged(self, data: bytes, name: Any) -> tuple[bytes, int]:
        at = _resolve_offset(self.spec.params["offset"], len(data), name)
        changed = bytearray(data)
        changed[at] ^= 1 << self.spec.params["bit"]
        return bytes(changed), at

    def summary(self, done: list[Any]) -> dict[str, Any]:
        return {"offsets": done, "bit": self.spec.params["bit"]}


class Truncate(RewritesBytes):
    """Every matching file cut to ``keep`` bytes (an integer) or to that fraction of its size (a
    number between 0 and 1), as an interrupted copy or a lost tail of a write leaves it."""

    kind = "truncate"
    params = {"keep": (object, 0.5)}
    detail_key = "sizes"

    @classmethod
    def check(cls, spec):
        keep = spec.params.get("keep")
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or keep < 0 or (
                isinstance(keep, float) and keep >= 1):
            return ("fault.keep", "must be a byte count or a fraction of the file", keep,
                    "an integer >= 0 (bytes) or a number in (0, 1) (fraction)")
        return None

    def damaged(self, data: bytes, name: Any) -> tuple[bytes, list[int]]:
        keep, size = self.spec.params["keep"], len(data)
        new = int(size * keep) if isinstance(keep, float) else min(keep, size)
        return data[:new], [size, new]


class ZeroBlock(RewritesBytes):
    """``length`` bytes from ``offset`` (or the middle) overwritten with zeros in every matching
    file, as a lost block on a filesystem that zero-fills it does."""

    kind = "zero_block"
    params = {"offset": (object, MIDDLE), "length": (object, 4096)}
    detail_key = "ranges"

    @classmethod
    def check(cls, spec):
        length = spec.params.get("length")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            return ("fault.length", "must be a byte count", length, "an integer >= 1")
        return _offset_problem("offset", spec.params.get("offset"))

    def damaged(self, data: bytes, name: Any) -> tuple[bytes, list[int]]:
        at = _resolve_offset(self.spec.params["offset"], len(data), name)
        length = min(self.spec.params["length"], len(data) - at)
        return data[:at] + bytes(length) + data[at + length:], [at, at + length]


class MissingFile(RewritesBytes):
    """Every matching file deleted: a shard lost by a failed upload or an over-eager cleanup."""

    kind = "missing_file"

    def damaged(self, data: bytes, name: Any) -> tuple[None, None]:
        return None, None
