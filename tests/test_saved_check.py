"""Saves verified where they were made (``verify_saves``, `resilience.oracle.saved_check`): fresh
ranks restore the first run's earlier saves right after it. Real ranks and files."""
from __future__ import annotations

import pytest

from resilience.core.plan import SAVED_CHECK
from resilience.errors import ScenarioError
from resilience.run.harness import Harness
from resilience.scenario.loader import load_document

MISNAMED = "resilience.planted.timeline_bugs:MisnamesRankOneShard"
CASE = {"name": "no fault", "workload": {"model": "mlp", "world_size": 2, "steps": 12, "checkpoint_every": 4,
                                         "seed": 0},
        "fault": "none", "verify_saves": True, "expect": "recovers", "timeouts": {"phase": 60}}


def run(tmp_path, strategy: str):
    return Harness(work_root=tmp_path).run(load_document({**CASE, "strategy": strategy}, "t.yaml").cases[0])


def test_a_shard_no_restore_reads_is_reported_lost_at_save_time(tmp_path):
    result = run(tmp_path, MISNAMED)
    assert result.verdict.kind.value == "SILENT"
    assert result.verdict.findings[0].startswith(
        "saved check: the step-4 save returned on every rank, but fresh ranks cannot restore it (FileNotFoundError")
    assert result.verdict.findings[0].endswith(": a checkpoint lost at save time")


def test_its_twin_has_every_earlier_save_restored_to_the_reference_state(tmp_path):
    result = run(tmp_path, "torch.per_rank")
    assert result.verdict.kind.value == "RECOVERED", result.verdict.findings
    check = result.phase(SAVED_CHECK)
    assert sorted((e["rank"], e["checked"]) for e in check.events("verified")) == [(0, 4), (0, 8), (1, 4), (1, 8)]
    assert not check.events("loss")  # nothing trained: only restored


def test_verify_saves_needs_a_strategy_that_restores_a_chosen_step_itself():
    with pytest.raises(ScenarioError, match="verify_saves: needs a strategy that restores a chosen step outside its "
                                            "own training loop, which strategy lightning is not"):
        load_document({**CASE, "strategy": "lightning"}, "t.yaml")
    with pytest.raises(ScenarioError, match="verify_saves: must be true or false"):
        load_document({**CASE, "strategy": "torch.per_rank", "verify_saves": "yes"}, "t.yaml")


def test_on_by_default_where_the_fault_leaves_saved_files_alone():
    def verifies(**changes) -> bool:
        return load_document({**{k: v for k, v in CASE.items() if k != "verify_saves"}, "strategy": "torch.per_rank",
                              **changes}, "t.yaml").cases[0].verify_saves

    assert verifies() and verifies(fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    assert not verifies(fault={"kind": "bit_flip", "rank": 1, "step": 8})  # it acts on the saved files
    assert not verifies(verify_saves=False)
    assert not verifies(strategy="dcp")  # no load_step: nothing to check with, and no error either
