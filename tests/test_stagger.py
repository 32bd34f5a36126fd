"""torch.per_rank's `stagger: K`: ranks write in waves of K with a barrier between waves. Real ranks, real files."""
from __future__ import annotations

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import ScenarioError

from .harness_helpers import case_from, run_case

FOUR_RANKS = {"world_size": 4, "global_batch": 16}


@pytest.mark.parametrize("value", [0, -1, "two", True])
def test_stagger_must_be_a_positive_integer(value):
    with pytest.raises(ScenarioError, match=r"strategy\.options\.stagger: .*got"):
        case_from(strategy={"name": "torch.per_rank", "options": {"stagger": value}})


def test_staggered_saves_recover_bitwise(tmp_path):
    result = run_case(tmp_path, strategy={"name": "torch.per_rank", "options": {"stagger": 1}}, workload=FOUR_RANKS)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert sorted(result.save_s) == [4, 8]


def test_a_wave_waits_for_the_one_before(tmp_path):
    """Rank 1 killed 4 KiB into its step-8 file, waves of 2: rank 0's file is complete, rank 1's torn,
    and ranks 2 and 3 (the next wave) never started theirs."""
    kill = {"kind": "kill", "rank": 1, "step": 8, "point": "write", "file": "*_rank_1.pt", "after_bytes": 4096}
    result = run_case(tmp_path, keep=True, strategy={"name": "torch.per_rank", "options": {"stagger": 2}},
                      workload=FOUR_RANKS, fault=kill)
    step_8 = result.work_dir / "checkpoints" / "step_00000008"
    sizes = {p.name: p.stat().st_size for p in step_8.iterdir()}
    assert set(sizes) == {"ckpt_rank_0.pt", "ckpt_rank_1.pt"}, sizes
    assert sizes["ckpt_rank_1.pt"] == 4096 and sizes["ckpt_rank_0.pt"] > 4096
    assert result.verdict.kind is VerdictKind.LOUD  # the torn file is loaded at restore, as without stagger
