"""Cases under real torchrun (--standalone, one node): the elastic agent restarts the group after a
rank is SIGKILLed, and the verdict comes from the files the ranks wrote."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from resilience.commands.cli import main as cli_main
from resilience.core import device
from resilience.core.case import VerdictKind
from resilience.errors import HarnessError
from resilience.launch.warm_agent import live_agents
from resilience.run.torchrun import (
    TorchrunIncompatible,
    TorchrunOptions,
    incompatibility,
    run_case_under_torchrun,
    torchrun_command,
)

from .harness_helpers import case_from
from .procs import pids_naming

STRATEGIES = "tests.strategies_under_test"


def run_and_check_cleanup(tmp_path: Path, case, **options):
    result = run_case_under_torchrun(case, work_root=tmp_path, **options)
    assert list(tmp_path.iterdir()) == [], "the case directory (and torchrun's torchelastic_* in it) was left behind"
    assert pids_naming(tmp_path) == [], "a rank or torchrun outlived the case"
    assert live_agents() == [], "a warm torchrun agent outlived the case"
    return result


def phase_begins(result, name):
    phase = next(p for p in result.phases if p.name == name)
    return phase.events("phase_begin")


# -- real torchrun ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_killed_rank_is_restarted_by_the_elastic_agent_and_the_restore_verifies(tmp_path):
    case = case_from(fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    result = run_and_check_cleanup(tmp_path, case, nnodes=1, nproc_per_node=2, max_restarts=1)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 4
    assert [e["rank"] for e in result.phases[1].fault_events] == [1]
    assert result.phases[1].ranks[1].returncode == -9  # recorded by the rank's supervisor
    # the restore ran in the agent's own restart of the same launch, on every rank
    assert {(e["launch"], e["restart_count"]) for e in phase_begins(result, "restart")} == {(0, 1)}


@pytest.mark.slow
def test_a_torn_checkpoint_restored_under_torchrun_is_loud(tmp_path):
    case = case_from(fault={"kind": "kill", "rank": 0, "step": 8, "phase": "save", "point": "write",
                            "file": "*_rank_0.pt", "after_bytes": 4096},
                     expect={"outcome": "fails_loudly", "error": "central directory"})
    result = run_and_check_cleanup(tmp_path, case, max_restarts=1)
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    error = result.verdict.first_error
    assert error.phase == "restart" and "central directory" in error.summary()
    # availability inside LOUD under torchrun too: step 4 restored and verified by fresh local ranks
    assert result.verdict.intact_step == 4, result.verdict.findings
    assert any(finding.startswith("refused; step 4 was intact") for finding in result.verdict.findings)
    assert [p.name for p in result.phases][-1] == "fallback"


@pytest.mark.slow
def test_a_job_without_a_fault_is_resumed_by_a_second_launch_and_verifies(tmp_path):
    result = run_and_check_cleanup(tmp_path, case_from(strategy="torch.rank0"), max_restarts=1)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 8
    assert {(e["launch"], e["restart_count"]) for e in phase_begins(result, "restart")} == {(1, 0)}


@pytest.mark.slow
def test_a_broken_strategy_is_silent_under_torchrun_too(tmp_path):
    case = case_from(strategy=f"{STRATEGIES}:ForgetsOptimizer",
                     fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    result = run_and_check_cleanup(tmp_path, case)
    assert result.verdict.kind is VerdictKind.SILENT, result.verdict.findings
    assert any("optimizer" in line for line in result.verdict.state_diff)


@pytest.mark.slow
def test_a_restore_that_never_finishes_is_a_hang_with_every_rank_placed(tmp_path):
    case = case_from(strategy=f"{STRATEGIES}:StallsOnLoad", timeouts={"collective": 600, "phase": 20})
    result = run_and_check_cleanup(tmp_path, case, startup_s=40)
    assert result.verdict.kind is VerdictKind.HANG, result.verdict.findings
    findings = "\n".join(result.verdict.findings)
    assert "phase restart passed its 20 s deadline" in findings
    assert "rank 0: waiting in" in findings and "rank 1: at " in findings and "in load" in findings


@pytest.mark.slow
def test_the_cli_runs_a_scenario_under_torchrun_and_refuses_incompatible_cases(tmp_path, capsys):
    scenarios = Path(__file__).resolve().parent.parent / "scenarios"
    assert cli_main(["torchrun", str(scenarios / "kill_mid_write_other_rank.scenario.yaml"),
                     "--case", "strategy=torch.rank0,fault.point=start", "--workdir", str(tmp_path)]) == 0
    assert "PASSED RECOVERED" in capsys.readouterr().out
    assert cli_main(["torchrun", str(scenarios / "world_size_change.scenario.yaml")]) == 1
    assert "torchrun's agent restarts a group at the size it had" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


# -- what torchrun cannot express, and how it is launched -------------------------------------------

@pytest.mark.parametrize("overrides, options, words", [
    ({"restart": {"world_size": 4}}, {}, "restarts a group at the size it had"),
    ({"restart": {"rank_map": "reverse"}}, {}, "torchrun assigns ranks itself"),
    ({"fault": {"kind": "stall", "rank": 1, "step": 6, "phase": "train", "seconds": 3}}, {},
     "driven from outside the ranks"),
    ({"fault": {"kind": "preempt", "rank": 1, "step": 6, "phase": "train"}}, {}, "driven from outside the ranks"),
    ({"fault": {"kind": "disk_full", "rank": 0, "step": 8, "after_bytes": 5}}, {}, "repaired or released between"),
    ({"fault": {"kind": "straggler", "rank": 1, "step": 8, "file": "step_00000008*_rank_1.pt",
                "source": "step_00000004*_rank_1.pt"}}, {}, "repaired or released between"),
    ({}, {"nproc_per_node": 3}, "nnodes 1 x nproc_per_node 3 = 3"),
    ({}, {"nnodes": 2}, "need rdzv_endpoint"),
])
def test_cases_torchrun_cannot_express_are_refused_with_the_reason(overrides, options, words):
    case = case_from(**overrides)
    reason = incompatibility(case, TorchrunOptions(**options))
    assert reason is not None and words in reason and "tests/generated.scenario.yaml" in reason
    with pytest.raises(TorchrunIncompatible, match="generated"):
        run_case_under_torchrun(case, **options)


def test_kill_and_version_faults_are_torchrun_compatible():
    assert incompatibility(case_from(fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})) is None
    assert incompatibility(case_from(strategy={"name": "torch.per_rank", "options": {"check_version": True}},
                                     fault={"kind": "version_mismatch", "rank": 1, "step": 4,
                                            "version": "newer"})) is None


def test_one_node_runs_standalone_and_several_use_the_c10d_endpoint(tmp_path):
    case = case_from(workload={"world_size": 4, "global_batch": 8})
    single = torchrun_command(case, TorchrunOptions(), tmp_path)
    assert "--standalone" in single and single[single.index("--nproc-per-node") + 1] == "4"
    multi = torchrun_command(case, TorchrunOptions(nnodes=2, rdzv_endpoint="10.0.0.1:29400"), tmp_path, launch=1)
    assert "--standalone" not in multi
    assert multi[multi.index("--rdzv-backend") + 1] == "c10d"
    assert multi[multi.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert multi[multi.index("--nproc-per-node") + 1] == "2" and multi[multi.index("--max-restarts") + 1] == "1"
    assert multi[multi.index("--rdzv-id") + 1].endswith("-1")  # each launch is a job of its own
    assert multi[-3:] == ["-m", "resilience.rank.elastic_entry", str(tmp_path)]


# -- the GPU path -----------------------------------------------------------------------------------

def test_ranks_take_nccl_and_their_local_gpu_when_cuda_exists_and_gloo_on_the_cpu_otherwise():
    assert device.choose(cuda_devices=0, local_rank=3) == device.Placement("gloo", "cpu")
    assert device.choose(cuda_devices=8, local_rank=3) == device.Placement("nccl", "cuda:3")
    assert device.choose(cuda_devices=8, local_rank=3, force="cpu") == device.Placement("gloo", "cpu")
    with pytest.raises(ValueError, match="LOCAL_RANK 2 has no GPU of its own: this node has 2"):
        device.choose(cuda_devices=2, local_rank=2)
    with pytest.raises(ValueError, match="RESILIENCE_DEVICE: unknown value; got 'gpu'"):
        device.choose(cuda_devices=2, local_rank=0, force="gpu")


def test_the_local_rank_comes_from_torchrun_or_else_is_the_rank():
    assert device.local_rank({"LOCAL_RANK": "1"}, rank=5) == 1
    assert device.local_rank({}, rank=5) == 5
    with pytest.raises(ValueError, match="LOCAL_RANK: not an integer; got 'x'"):
        device.local_rank({"LOCAL_RANK": "x"}, rank=0)


@pytest.mark.slow
def test_on_this_machine_the_ranks_ran_on_what_cuda_offers(tmp_path):
    """The placement each rank reports is the one the device rules give for this machine."""
    import torch

    result = run_and_check_cleanup(tmp_path, case_from(fault={"kind": "kill", "rank": 0, "step": 6,
                                                              "phase": "train"}))
    expected = device.choose(torch.cuda.device_count() if torch.cuda.is_available() else 0, 0,
                             os.environ.get(device.FORCE_ENV, "auto"))
    begins = phase_begins(result, "restart")
    assert {e["backend"] for e in begins} == {expected.backend}
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings


@pytest.mark.gpu
def test_a_killed_rank_on_gpus_restores_under_nccl(tmp_path):
    """Deselected where CUDA is missing (tests/conftest.py), so CPU machines never skip it."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.fail(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    case = case_from(fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    result = run_and_check_cleanup(tmp_path, case)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert {(e["backend"], e["device"]) for e in phase_begins(result, "restart")} == {("nccl", "cuda:0"),
                                                                                       ("nccl", "cuda:1")}


def test_a_case_directory_with_an_earlier_run_in_it_is_refused(tmp_path):
    (tmp_path / "launch0.restart0").mkdir()
    with pytest.raises(HarnessError, match="holds an earlier run's ranks .launch0.restart0."):
        run_case_under_torchrun(case_from(), case_dir=tmp_path)


def test_the_reference_cache_key_tells_the_cpu_path_from_the_gpu_path(monkeypatch):
    from resilience.run.reference_cache import reference_key

    case = case_from()
    assert device.machine_placement() in ("gloo on the CPU",) or device.machine_placement().startswith("nccl on ")
    automatic = reference_key(case, False)
    monkeypatch.setattr(device, "machine_placement", lambda: "nccl on 8 GPUs")
    assert reference_key(case, False) != automatic
