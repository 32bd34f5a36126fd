"""Build a case from a small document and run it through the real harness."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from resilience.core.records import CaseResult
from resilience.errors import Unavailable
from resilience.launch.interpreters import layered_packages
from resilience.run.harness import Harness
from resilience.run.reference_cache import ReferenceCache
from resilience.scenario.loader import load_document

# The reference cache of this pytest run: a directory tests/conftest.py makes once per run (shared
# by every pytest-xdist worker) and removes at its end. Unset (a test marked ``fresh_reference``,
# or these helpers used outside that run): every case runs its own reference.
REFERENCE_CACHE_ENV = "RESILIENCE_TESTS_REFERENCE_CACHE"

BASE = {
    "name": "test case",
    "description": "built by a test",
    "strategy": "torch.per_rank",
    "workload": {"model": "mlp", "world_size": 2, "steps": 8, "checkpoint_every": 4, "seed": 0},
    "fault": {"kind": "none"},
    "expect": "recovers",
}


def case_from(**overrides):
    document = copy.deepcopy(BASE)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            document[key].update(value)
        else:
            document[key] = value
    return load_document(document, "tests/generated.scenario.yaml").cases[0]


def shared_reference_cache() -> ReferenceCache | None:
    """The run's reference cache: its key covers the workload, the topology, torch and the source
    of every module a rank runs, so an entry is the reference this case would compute."""
    root = os.environ.get(REFERENCE_CACHE_ENV)
    return ReferenceCache(Path(root)) if root else None


def run_case(tmp_path=None, keep=False, **overrides) -> CaseResult:
    harness = Harness(work_root=tmp_path, keep=keep, cache=shared_reference_cache())
    return harness.run(case_from(**overrides))


def layered_or_skip(packages: tuple[str, ...], library: str) -> None:
    """``packages`` in the packages cache (installed on first use), or a skip saying why (CI=true
    fails it)."""
    try:
        layered_packages(packages)
    except Unavailable as exc:
        pytest.skip(f"{library}'s packages cannot be installed here: {exc}")
