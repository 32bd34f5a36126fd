"""Real DeepSpeed ZeRO engines as systems under test (skipped, with the reason, where DeepSpeed is
missing; CI=true turns that skip into a failure)."""
from __future__ import annotations

import importlib.util

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import ScenarioError, StrategyUnavailable
from resilience.faults.base import CaseEnvironment, Fault
from resilience.run.harness import Harness
from resilience.strategies.base import CheckpointStrategy
from resilience.strategies.deepspeed.zero import Zero2

from .harness_helpers import case_from, run_case

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed: "
                                            "DS_BUILD_OPS=0 pip install 'resilience[deepspeed]'")
WORKLOAD = {"model": "mlp", "world_size": 2, "steps": 12, "checkpoint_every": 4, "seed": 0, "global_batch": 12}


class TruncateNewestOptimShard(Fault):
    """The operator's hands between the runs: rank 1's optimizer shard of the newest tag (the one
    ``latest`` names) cut to half its size after a clean first run."""

    kind = "tests.test_deepspeed:TruncateNewestOptimShard"
    needs_trigger = False

    def heal(self, env: CaseEnvironment) -> None:
        tag = (env.checkpoint_dir / "latest").read_text().strip()
        (shard,) = (env.checkpoint_dir / tag).glob("zero_pp_rank_1_*optim_states.pt")
        size = shard.stat().st_size
        with open(shard, "r+b") as file:
            file.truncate(size // 2)
        self.truncated = (shard.name, size)


@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_an_optimizer_shard_truncated_by_hand_is_never_recovered(tmp_path, stage):
    result = run_case(tmp_path, strategy=f"deepspeed.zero{stage}", workload=WORKLOAD,
                      fault={"kind": TruncateNewestOptimShard.kind}, expect="fails_loudly")
    assert result.verdict.kind in (VerdictKind.LOUD, VerdictKind.SILENT), result.verdict.findings
    # what DeepSpeed does: torch.load of the cut zip raises ("[Errno 22] Invalid argument")
    assert result.verdict.kind is VerdictKind.LOUD
    assert result.verdict.first_error.phase == "restart" and result.verdict.first_error.rank == 1


@needs_deepspeed
def test_a_data_parallel_size_change_is_loud_without_the_universal_route(tmp_path):
    result = run_case(tmp_path, strategy="deepspeed.zero2", workload=WORKLOAD,
                      fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"},
                      restart={"world_size": 3}, expect="fails_loudly")
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    assert result.verdict.first_error.type == "ZeRORuntimeException"
    assert "DP world size of 2" in result.verdict.first_error.message


@needs_deepspeed
def test_the_universal_route_reshards_zero2_bitwise(tmp_path):
    result = run_case(tmp_path, strategy={"name": "deepspeed.zero2", "options": {"restore": "universal"}},
                      workload=WORKLOAD, fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"},
                      restart={"world_size": 3})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 4
    restart = next(phase for phase in result.phases if phase.name == "restart")
    assert restart.world_size == 3 and len(restart.losses(0)) == 8  # steps 5..12 compared bitwise


def test_restore_route_is_validated_by_the_loader():
    with pytest.raises(ScenarioError) as info:
        case_from(strategy={"name": "deepspeed.zero2", "options": {"restore": "sideways"}})
    message = str(info.value)
    assert "strategy.options.restore" in message and "'sideways'" in message and "native, universal" in message


def test_once_written_must_be_a_name():
    with pytest.raises(ScenarioError) as info:
        case_from(fault={"kind": "kill", "rank": 1, "step": 8, "phase": "save", "point": "open",
                         "file": "*.pt", "once_written": 7})
    assert "fault.once_written" in str(info.value) and "got 7" in str(info.value)


def test_a_strategy_whose_library_is_missing_is_skipped_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(Zero2, "requires", {"deepspeed_is_not_here": "pip install 'resilience[deepspeed]'"})
    with pytest.raises(StrategyUnavailable) as info:
        Harness(work_root=tmp_path).run(case_from(strategy="deepspeed.zero2"))
    assert "deepspeed_is_not_here is not installed (pip install 'resilience[deepspeed]')" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing left
    assert CheckpointStrategy.missing() is None
