"""torch.distributed.checkpoint over FSDP2 as a system under test, with real gloo ranks."""
from __future__ import annotations

import json

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import ScenarioError
from resilience.faults.base import CaseEnvironment
from resilience.faults.process.kill import Kill
from resilience.strategies.torch.dcp import METADATA, DcpCheckpoint, committed_steps, step_dir

from .harness_helpers import case_from, run_case

WORKLOAD = {"model": "mlp", "world_size": 4, "steps": 8, "checkpoint_every": 4, "seed": 0}


class DcpWithoutOptimizer(DcpCheckpoint):
    """Deliberately broken: restores the model shards through DCP but leaves Adam's moments cold."""

    def load(self, workload):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        (newest, *_) = committed_steps(self.context.checkpoint_dir)
        state = self.workload.sharded_state()
        del state["optimizer"]  # DCP loads the keys asked for, and says nothing of the others
        dcp.load(state, checkpoint_id=str(step_dir(self.context.checkpoint_dir, newest)))
        set_model_state_dict(self.workload.model, state["model"])
        self.workload.scheduler.load_state_dict(state["scheduler"])
        self.workload.inner.load_progress_state(state["progress"])


def test_saved_at_4_ranks_restored_at_2_with_full_state_equal_bitwise(tmp_path):
    result = run_case(tmp_path, strategy="dcp", workload=WORKLOAD,
                      fault={"kind": "kill", "rank": 3, "step": 6, "phase": "train"}, restart={"world_size": 2})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 4
    phases = {phase.name: phase for phase in result.phases}
    restored = phases["restart"].restored()
    assert phases["restart"].world_size == 2 and sorted(restored) == [0, 1]
    # the fingerprint is of the full, unsharded state, and equal to the continuation's entry by entry
    fingerprint = restored[0]["fingerprint"]
    assert "model.0.weight" in fingerprint and "optimizer.state.0.weight.exp_avg_sq" in fingerprint
    assert fingerprint == phases["continuation"].restored()[0]["fingerprint"]
    assert sorted(phases["restart"].losses(1)) == [5, 6, 7, 8]  # each compared bitwise with the continuation


class KillThenList(Kill):
    """A kill, and between the runs a listing of what it left in the step-8 directory."""

    kind = "tests.test_dcp:KillThenList"

    def heal(self, env: CaseEnvironment) -> None:
        directory = step_dir(env.checkpoint_dir, 8)
        listing = {p.name: p.stat().st_size for p in directory.iterdir()}
        (env.case_dir / "step_8_after_first_run.json").write_text(json.dumps(listing))


def test_a_data_file_torn_on_another_rank_leaves_no_metadata_and_step_4_is_restored(tmp_path):
    result = run_case(tmp_path, keep=True, strategy="dcp", workload=WORKLOAD,
                      fault={"kind": KillThenList.kind, "rank": 2, "step": 8, "phase": "save", "point": "write",
                             "file": "step_00000008/__2_0.distcp", "after_bytes": 4096})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 4
    left = json.loads((result.work_dir / "step_8_after_first_run.json").read_text())
    assert left["__2_0.distcp"] == 4096 and METADATA not in left
    # the restart trained on from step 4 and wrote step 8 again, over the torn one, completely
    assert committed_steps(result.work_dir / "checkpoints") == [8, 4]


def test_the_checker_catches_a_dcp_restore_that_forgets_the_optimizer(tmp_path):
    result = run_case(tmp_path, strategy="tests.test_dcp:DcpWithoutOptimizer",
                      workload={**WORKLOAD, "world_size": 2},
                      fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    assert result.verdict.kind is VerdictKind.SILENT, result.verdict.findings
    assert any("optimizer.state" in entry for entry in result.verdict.state_diff)
    assert not any("model." in entry for entry in result.verdict.state_diff)


def test_the_newest_step_is_the_newest_directory_with_metadata(tmp_path):
    for step, complete in ((4, True), (8, True), (12, False)):
        directory = step_dir(tmp_path, step)
        directory.mkdir()
        (directory / "__0_0.distcp").write_bytes(b"x")
        if complete:
            (directory / METADATA).write_bytes(b"x")
    (step_dir(tmp_path, 16)).mkdir()
    (tmp_path / "step_20_not_a_step").mkdir()
    assert committed_steps(tmp_path) == [8, 4]
    assert committed_steps(tmp_path / "absent") == []


@pytest.mark.parametrize("option, allowed", [("mode", "sync, async"), ("storage", "filesystem, fsspec")])
def test_options_are_validated_by_the_loader(option, allowed):
    with pytest.raises(ScenarioError) as info:
        case_from(strategy={"name": "dcp", "options": {option: "sideways"}})
    message = str(info.value)
    assert f"strategy.options.{option}" in message and "'sideways'" in message and allowed in message
