"""The base of every name that crosses between processes or into a report (event kinds, phase and
case statuses): an enum whose members are strs, so a record stays plain JSON, compares equal to
the string read back, and prints as its value on every Python version."""
from __future__ import annotations

import enum


class WireName(str, enum.Enum):
    """A member is its value wherever it is written: JSON, messages, f-strings (as 3.11's StrEnum)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return format(str.__str__(self), spec)
