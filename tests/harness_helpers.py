"""Build a case from a small document and run it through the real harness."""
from __future__ import annotations

import copy

from resilience.core.records import CaseResult
from resilience.run.harness import Harness
from resilience.scenario.loader import load_document

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


def run_case(tmp_path=None, keep=False, **overrides) -> CaseResult:
    return Harness(work_root=tmp_path, keep=keep).run(case_from(**overrides))
