"""Hostile checkpoints: a file whose pickle runs code when loaded must never run it in a built-in
loading path, and when a strategy does unpickle in full, the verdict says so (SILENT)."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from resilience.core.case import VerdictKind
from resilience.faults.at_rest.hostile import CANARY_DIR, PICKLE, TORCH_ZIP, plant
from resilience.faults.base import CaseEnvironment

from .harness_helpers import case_from, run_case

STATE = {"weight": torch.arange(16, dtype=torch.float32).reshape(4, 4), "step": 8, "nested": {"lr": 0.5}}
FAULT = {"kind": "malicious_pickle", "rank": 1, "step": 4, "file": "step_00000004*_rank_1.pt"}


def planted_torch_file(tmp_path: Path) -> tuple[Path, Path]:
    path, canary = tmp_path / "ckpt.pt", tmp_path / "payload_ran"
    torch.save(STATE, path)
    assert plant(path, canary) == TORCH_ZIP
    return path, canary


def test_full_unpickling_runs_the_payload_and_still_gets_the_original_state(tmp_path):
    """Not vacuous: the crafted file really runs its code under torch.load(weights_only=False)."""
    path, canary = planted_torch_file(tmp_path)
    assert not canary.exists()  # planting it ran nothing
    loaded = torch.load(path, weights_only=False)
    assert canary.is_dir()
    assert torch.equal(loaded["weight"], STATE["weight"]) and loaded["step"] == 8 and loaded["nested"] == {"lr": 0.5}


def test_weights_only_refuses_the_file_without_running_anything(tmp_path):
    path, canary = planted_torch_file(tmp_path)
    refused = "(?s)Weights only load failed.*Unsupported global: GLOBAL _operator.getitem"
    with pytest.raises(pickle.UnpicklingError, match=refused):
        torch.load(path, weights_only=True)
    assert not canary.exists()


def test_a_raw_pickle_carries_the_payload_too(tmp_path):
    """DCP's .metadata is a plain pickle, read with pickle.load."""
    path, canary = tmp_path / ".metadata", tmp_path / "payload_ran"
    path.write_bytes(pickle.dumps({"planner": "default", "shards": [1, 2]}))
    assert plant(path, canary) == PICKLE
    assert pickle.loads(path.read_bytes()) == {"planner": "default", "shards": [1, 2]}
    assert canary.is_dir()


def test_a_file_that_is_neither_a_torch_zip_nor_one_pickle_is_refused(tmp_path):
    path = tmp_path / "latest"
    path.write_text("global_step8")
    with pytest.raises(ValueError, match="neither a torch zip file nor a pickle"):
        plant(path, tmp_path / "payload_ran")


def test_weights_only_loading_is_loud_and_never_runs_the_payload(tmp_path):
    result = run_case(tmp_path, keep=True, fault=FAULT, expect={"outcome": "fails_loudly"})
    assert result.fault_fired
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    assert "Weights only load failed" in result.verdict.first_error.summary()
    canaries = result.work_dir / CANARY_DIR
    assert (canaries / "carriers.json").exists() and not list(canaries.glob("payload_ran*"))


def test_a_strategy_that_unpickles_in_full_is_silent_and_the_finding_names_file_and_phase(tmp_path):
    result = run_case(tmp_path, keep=True, strategy="tests.strategies_under_test:UnpicklesInFull", fault=FAULT)
    verdict = result.verdict
    assert verdict.kind is VerdictKind.SILENT
    assert verdict.restored_step == 4 and verdict.first_error is None  # otherwise a perfect recovery
    assert len(verdict.findings) == 1
    assert verdict.findings[0].startswith("step_00000004/ckpt_rank_1.pt: its pickle ran the payload")
    assert "during the restart's restore" in verdict.findings[0] and verdict.findings[0].endswith("the job went on")


def test_no_record_no_finding(tmp_path):
    """A fault that never fired leaves nothing to report (the outcome says it never fired)."""
    case = case_from(fault=FAULT)
    from resilience.core import registry

    fault = registry.resolve("fault", "malicious_pickle")(case.fault)
    env = CaseEnvironment(case=case, case_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")
    assert fault.findings(env, ()) == ()
