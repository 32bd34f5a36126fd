"""Raw sequential write + fsync bandwidth of a directory: the ceiling a checkpoint save can reach there.

A bounded probe: one file of ``size_bytes`` written in ``block_bytes`` blocks of incompressible data,
then fsync, then removed. Its figure is only meaningful next to figures taken in the same run
(strategy save and restore throughput as fractions of it): shared machines vary run to run.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SIZE = 128 << 20
BLOCK = 8 << 20
MAX_SIZE = 4 << 30


@dataclass(frozen=True)
class BandwidthProbe:
    directory: str
    size_bytes: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.size_bytes / self.seconds if self.seconds > 0 else 0.0


def measure_write_bandwidth(directory: Path, size_bytes: int = DEFAULT_SIZE,
                            deadline_s: float = 300.0) -> BandwidthProbe:
    """Write ``size_bytes`` sequentially into a new file under ``directory``, fsync it, time both.

    Raises ``TimeoutError`` when the filesystem is slower than ``deadline_s`` allows (the partial
    file is removed either way)."""
    if not 0 < size_bytes <= MAX_SIZE:
        raise ValueError(f"probe size {size_bytes} bytes; allowed: 1..{MAX_SIZE}")
    directory.mkdir(parents=True, exist_ok=True)
    block = os.urandom(min(BLOCK, size_bytes))  # random: no filesystem compression flatters the figure
    handle, name = tempfile.mkstemp(prefix=".resilience-probe-", dir=directory)
    try:
        started = time.monotonic()
        written = 0
        while written < size_bytes:
            if time.monotonic() - started > deadline_s:
                raise TimeoutError(f"writing {size_bytes} bytes to {directory} took over {deadline_s:g} s")
            chunk = block[:size_bytes - written]
            written += os.write(handle, chunk)
        os.fsync(handle)
        elapsed = time.monotonic() - started
    finally:
        os.close(handle)
        os.unlink(name)
    return BandwidthProbe(directory=str(directory), size_bytes=size_bytes, seconds=elapsed)
