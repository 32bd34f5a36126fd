"""`resilience verify CHECKPOINT_DIR`: real checkpoints written by real ranks, loaded back by real ranks.
Each way a checkpoint can be incomplete or wrong must give a non-zero exit and say what is wrong."""
from __future__ import annotations

import shutil

import pytest
import torch

from resilience.commands import cli

from .harness_helpers import run_case


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints of a 2-rank no-fault job with each torch scheme (steps 4 and 8)."""
    root = tmp_path_factory.mktemp("verify")
    dirs = {}
    for strategy in ("torch.per_rank", "torch.rank0"):
        result = run_case(root / strategy, keep=True, strategy=strategy)
        assert result.verdict.kind.value == "RECOVERED"
        dirs[strategy] = root / f"{strategy}-checkpoints"
        shutil.copytree(result.work_dir / "checkpoints", dirs[strategy])
        shutil.rmtree(result.work_dir)
    return dirs


@pytest.fixture
def copy_of(saved, tmp_path):
    def make(strategy: str):
        target = tmp_path / "checkpoints"
        shutil.copytree(saved[strategy], target)
        return target
    return make


def verify(capsys, directory, *args) -> tuple[int, str]:
    status = cli.main(["verify", str(directory), *args])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.mark.parametrize("strategy", ["torch.per_rank", "torch.rank0"])
def test_intact_checkpoint_passes_with_step_check(saved, capsys, strategy):
    status, out = verify(capsys, saved[strategy], "--strategy", strategy, "--step-check")
    assert status == 0, out
    assert "OK" in out and "step 8" in out and "bitwise" in out


def test_missing_rank_file_fails(copy_of, capsys):
    directory = copy_of("torch.per_rank")
    (directory / "step_00000008" / "ckpt_rank_1.pt").unlink()
    status, out = verify(capsys, directory, "--strategy", "torch.per_rank")
    assert status == 1
    assert "rank 1 could not load" in out and "ckpt_rank_1.pt" in out


def test_more_ranks_than_saved_fails(saved, capsys):
    status, out = verify(capsys, saved["torch.per_rank"], "--strategy", "torch.per_rank", "--world-size", "3")
    assert status == 1 and "rank 2 could not load" in out


def test_torn_file_fails(copy_of, capsys):
    directory = copy_of("torch.rank0")
    path = directory / "step_00000008" / "model_optim.pt"
    path.write_bytes(path.read_bytes()[:4096])
    status, out = verify(capsys, directory, "--strategy", "torch.rank0")
    assert status == 1 and "could not load" in out


def test_ranks_at_different_steps_fail(copy_of, capsys):
    directory = copy_of("torch.per_rank")
    shutil.copy(directory / "step_00000004" / "ckpt_rank_1.pt", directory / "step_00000008" / "ckpt_rank_1.pt")
    status, out = verify(capsys, directory, "--strategy", "torch.per_rank")
    assert status == 1 and "ranks restored different steps: {0: 8, 1: 4}" in out


def test_recorded_loss_mismatch_fails_step_check(copy_of, capsys):
    directory = copy_of("torch.rank0")
    path = directory / "step_00000008" / "model_optim.pt"
    state = torch.load(path, weights_only=True)
    state["check_loss"] = state["check_loss"] * (1 + 1e-6)
    torch.save(state, path)
    status, out = verify(capsys, directory, "--strategy", "torch.rank0")
    assert status == 0, out  # without --step-check the recorded loss is not compared
    status, out = verify(capsys, directory, "--strategy", "torch.rank0", "--step-check")
    assert status == 1 and "the checkpoint recorded" in out


def test_empty_directory_fails(tmp_path, capsys):
    status, out = verify(capsys, tmp_path, "--strategy", "torch.per_rank")
    assert status == 1 and "found no checkpoint" in out


def test_bad_arguments_name_what_is_allowed(tmp_path, capsys):
    status, out = verify(capsys, tmp_path / "absent", "--strategy", "torch.per_rank")
    assert status == 2 and "not a directory" in out
    status, out = verify(capsys, tmp_path, "--strategy", "torch.nope")
    assert status == 2 and "torch.rank0" in out
    status, out = verify(capsys, tmp_path, "--strategy", "torch.per_rank", "--option", "stagger")
    assert status == 2 and "KEY=VALUE" in out


def test_deepspeed_checkpoint_passes_with_step_check(tmp_path, capsys):
    """The loss recorded in DeepSpeed's client state at save time, recomputed after load_checkpoint."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (DS_BUILD_OPS=0 pip install -e '.[deepspeed]')")
    result = run_case(tmp_path, keep=True, strategy="deepspeed.zero2")
    assert result.verdict.kind.value == "RECOVERED", result.verdict.findings
    status, out = verify(capsys, result.work_dir / "checkpoints", "--strategy", "deepspeed.zero2",
                         "--option", "restore=native", "--step-check")
    shutil.rmtree(result.work_dir)
    assert status == 0, out
    assert "step 8" in out and "bitwise" in out
