"""torchtitan's checkpoint manager as the system under test (strategy torchtitan): every phase runs
with torchtitan 0.3.0 layered over this environment, installed once from the package index into the
packages cache (a machine that cannot reach it skips, with the reason; CI=true fails that skip)."""
from __future__ import annotations

import pytest

from resilience.core.case import Software, VerdictKind
from resilience.core.plan import REFERENCE, RESTART
from resilience.errors import ScenarioError
from resilience.strategies.torchtitan import PACKAGES

from .harness_helpers import case_from, layered_or_skip, run_case

TITAN = {"model": "mlp", "world_size": 2, "steps": 8, "checkpoint_every": 2, "seed": 0}
KILL = {"kind": "kill", "rank": 1, "step": 5, "phase": "train"}


@pytest.fixture
def torchtitan_layered():
    layered_or_skip(PACKAGES, "torchtitan")


def test_every_phase_of_a_torchtitan_case_runs_with_its_packages_layered():
    case = case_from(strategy="torchtitan", workload=TITAN)
    assert case.software == Software(packages=PACKAGES) and PACKAGES[0] == "torchtitan==0.3.0"
    assert not case.software_changes  # the restart runs them too
    more = case_from(strategy="torchtitan", workload=TITAN, software={"packages": ["six==1.16.0"]})
    assert more.software.packages == (*PACKAGES, "six==1.16.0")


@pytest.mark.parametrize("options, key, shown", [
    ({"async_mode": "async_with_pinned_mem"}, "strategy.options.async_mode", "pinned CUDA memory"),
    ({"async_mode": "sometimes"}, "strategy.options.async_mode", "disabled"),
    ({"keep_latest_k": 1}, "strategy.options.keep_latest_k", "torchtitan refuses 1"),
    ({"token_masking": 1.5}, "strategy.options.token_masking", "probability below 1"),
    ({"export_dtype": "float16"}, "strategy.options.export_dtype", "bfloat16"),
    ({"last_save_in_hf": True, "last_save_model_only": False}, "strategy.options.last_save_in_hf",
     "needs last_save_model_only true"),
    ({"last_save_to_hf": True}, "strategy.options.last_save_to_hf", "unknown key"),
])
def test_bad_torchtitan_options_are_refused_by_name(options, key, shown):
    with pytest.raises(ScenarioError) as info:
        case_from(strategy={"name": "torchtitan", "options": options}, workload=TITAN)
    assert key in str(info.value) and shown in str(info.value), str(info.value)


def test_torchtitan_cannot_run_under_another_interpreter():
    with pytest.raises(ScenarioError, match="software.python.*runs with its own packages layered"):
        case_from(strategy="torchtitan", workload=TITAN, software={"python": "/usr/bin/python3"})


@pytest.mark.slow
def test_a_kill_between_saves_recovers_bitwise_under_torchtitan(tmp_path, torchtitan_layered):
    result = run_case(tmp_path, strategy="torchtitan", workload=TITAN, fault=KILL)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 4
    for phase in (REFERENCE, RESTART):
        assert {e["versions"]["torchtitan"] for e in result.phase(phase).events("joined")} == {"0.3.0"}
    restored = result.phase(RESTART).restored()[1]["fingerprint"]
    assert {key.split(".")[0] for key in restored} >= {"model", "optimizer", "lr_scheduler", "dataloader",
                                                       "train_state"}
    samples = [e["samples"] for e in result.phase(RESTART).ranks[1].events if e["event"] == "loss"]
    assert samples and all(samples)  # the batches' global indices reach the data audit


@pytest.mark.slow
def test_the_oracle_sees_a_dataloader_torchtitan_was_told_not_to_load(tmp_path, torchtitan_layered):
    result = run_case(tmp_path, strategy="tests.strategies_under_test:TitanExcludesDataloader", workload=TITAN,
                      fault=KILL)
    assert result.verdict.kind is VerdictKind.SILENT, result.verdict.findings
    assert any("differs from the reference" in line and "dataloader" in line for line in result.verdict.findings)
