"""Sizes as a scenario writes them (``64KiB``, ``512 MiB``, ``1GiB``, or bytes), read where a
scenario is validated and where a rank sizes its writes."""
from __future__ import annotations

import re
from typing import Any

SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
SIZE_PATTERN = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: Any) -> int | None:
    """Bytes from an int or a string like '64KiB', '512 MiB', '1GiB'; None if not a size."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text if text >= 0 else None
    if not isinstance(text, str):
        return None
    match = SIZE_PATTERN.match(text)
    if not match or match.group(2).lower() not in SIZE_UNITS:
        return None
    try:
        number = int(match.group(1))
    except ValueError:  # more digits than int() accepts (sys.get_int_max_str_digits)
        return None
    return number * SIZE_UNITS[match.group(2).lower()]
