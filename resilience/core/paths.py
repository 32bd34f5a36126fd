"""Paths every layer agrees on: where this code is imported from, and where a rank keeps its
temporary files (so whoever destroys the rank can remove them)."""
from __future__ import annotations

import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # where `import resilience` finds this code


def rank_temp_dir(pid: int) -> Path:
    """Where rank ``pid`` and the processes it starts keep temporary files (see the worker)."""
    return Path(tempfile.gettempdir()) / f"resilience-rank-{pid}"
