"""The data audit (`resilience.oracle.data_audit`): the samples a job trained, per epoch, against
the reference run, from the ``samples`` its ranks' loss events carry."""
from __future__ import annotations

import torch

from resilience.core.records import PhaseResult, RankRecord
from resilience.oracle import data_audit
from resilience.workloads.data import ShuffledSampler

GLOBAL_BATCH, DATASET = 8, 32  # 4 steps an epoch, two ranks of 4 samples each


def phase(name: str, steps: dict[int, list[int]], status: str = "completed") -> PhaseResult:
    """A two-rank phase whose step ``s`` trained ``steps[s]`` (rank 0 the first half)."""
    ranks = tuple(RankRecord(rank=rank, returncode=0, stdout_tail="", stderr_tail="", events=tuple(
        {"event": "loss", "rank": rank, "step": step, "loss": 0.0, "samples": samples[rank * 4:rank * 4 + 4]}
        for step, samples in sorted(steps.items()))) for rank in range(2))
    return PhaseResult(name=name, world_size=2, status=status, ranks=ranks, first_error=None, fault_events=(),
                       elapsed_s=0.0)


def sampler_steps(sampler: ShuffledSampler, first: int, last: int) -> dict[int, list[int]]:
    return {step: sampler.next_indices().tolist() for step in range(first, last + 1)}


def reference_steps(last: int = 12) -> dict[int, list[int]]:
    return sampler_steps(ShuffledSampler(0, DATASET, GLOBAL_BATCH), 1, last)


def test_a_restore_that_resumes_the_data_order_finds_nothing():
    reference = reference_steps()
    restart = {s: v for s, v in reference.items() if s > 6}
    assert data_audit.audit(phase("reference", reference), [phase("first_run", reference),
                            phase("restart", restart)], [6]) == []


def test_a_restore_that_replays_its_epoch_names_the_samples_trained_twice_and_never():
    """Restored at step 6 (epoch 1, batch 2) with the sampler back at the epoch's start: the first
    two batches of epoch 1 are trained twice, the last two never, and epoch 2 is an epoch late."""
    reference = reference_steps()
    replay = ShuffledSampler(0, DATASET, GLOBAL_BATCH)
    replay.load({"epoch": 1, "position": 0})
    restart = sampler_steps(replay, 7, 12)
    found = data_audit.audit(phase("reference", reference), [phase("first_run", reference), phase("restart", restart)],
                             [6])
    epoch_1 = reference[5] + reference[6]
    assert found[0].startswith("data: after the restore at step 6, 16 samples at positions 0..15 of epoch 1 "
                               "were trained twice (dataset indices " + ", ".join(map(str, epoch_1[:4])))
    assert "16 samples at positions 16..31 of epoch 1 were never trained" in found[1]
    assert any("of epoch 2 were never trained" in line for line in found)


def test_over_a_timeline_each_launch_goes_on_from_the_step_it_restored():
    """Three launches: the first run to step 5 (killed there), a restart from step 4 killed at
    step 9, a last launch from step 8 whose sampler lost the epoch position: only that launch's
    replay is named, with both restores in the finding."""
    reference = reference_steps()
    restart = {s: v for s, v in reference.items() if 4 < s <= 9}
    assert data_audit.audit(phase("reference", reference), [phase("first_run", {s: reference[s] for s in range(1, 6)}),
                            phase("restart", restart), phase("restart_2", {s: reference[s] for s in range(9, 13)})],
                            [4, 8]) == []
    replay = ShuffledSampler(0, DATASET, GLOBAL_BATCH)
    replay.load({"epoch": 2, "position": 0})
    found = data_audit.audit(phase("reference", reference), [phase("first_run", reference),
                             phase("restart", restart), phase("restart_2", sampler_steps(replay, 10, 12))], [4, 9])
    assert found == [f"data: after the restores at steps 4, 9, 8 samples at positions 0..7 of epoch 2 were trained "
                     f"twice (dataset indices {', '.join(map(str, reference[9][:4]))}, ...)",
                     "data: after the restores at steps 4, 9, 8 samples at positions 24..31 of epoch 2 were never "
                     f"trained (dataset indices {', '.join(map(str, reference[12][:4]))}, ...)"]


def test_epochs_are_cut_where_the_reference_repeats_a_sample():
    epochs = data_audit.epochs_of(reference_steps())
    assert [steps for steps, _ in epochs] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert all(sorted(samples) == list(range(DATASET)) for _, samples in epochs)


def test_no_audit_without_samples_or_a_completed_restart():
    reference = reference_steps()
    assert data_audit.audit(phase("reference", reference), [phase("first_run", reference),
                            phase("restart", {7: reference[7]}, status="failed")], [6]) == []
    bare = phase("reference", reference)
    bare = PhaseResult(name="reference", world_size=2, status="completed", first_error=None, fault_events=(),
                       elapsed_s=0.0, ranks=tuple(RankRecord(rank=r.rank, returncode=0, stdout_tail="", stderr_tail="",
                                                             events=tuple({k: v for k, v in e.items() if k != "samples"}
                                                                          for e in r.events)) for r in bare.ranks))
    assert data_audit.audit(bare, [bare, bare], [6]) == []


def test_the_mlp_workload_reports_the_rows_it_gathered():
    from resilience.core.case import WorkloadSpec
    from resilience.workloads.mlp import MLPWorkload

    workload = MLPWorkload(WorkloadSpec(model="mlp", world_size=2, steps=4, checkpoint_every=2, seed=0, global_batch=16,
                                        size_bytes=4096, rank_rng="same"), rank=1, world_size=2)
    inputs, _ = workload.next_local_batch()
    samples = workload.consumed_samples()
    assert len(samples) == workload.local_batch
    assert torch.allclose(inputs, workload.inputs[samples], atol=workload.noise_scale * 6)
    assert data_audit.spans([0, 1, 2, 5, 7, 8]) == "0..2, 5, 7..8"


def test_a_built_in_strategy_that_forgets_the_data_position_is_named_by_the_audit(tmp_path):
    """The planted per-rank save that restores everything but the sampler: restored at step 4 of a
    32-step epoch, the restart replays the epoch's first 4 global batches (positions 0..63) and
    never reaches the next 4 (64..127)."""
    from resilience.core.case import VerdictKind

    from .harness_helpers import run_case

    result = run_case(tmp_path, strategy="resilience.planted.state_bugs:ForgetsDataPosition",
                      fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    assert result.verdict.kind == VerdictKind.SILENT
    assert result.verdict.restored_step == 4
    data = [line for line in result.verdict.findings if line.startswith("data:")]
    assert data[0].startswith("data: after the restore at step 4, 64 samples at positions 0..63 of epoch 0 "
                              "were trained twice"), data
    assert "64 samples at positions 64..127 of epoch 0 were never trained" in data[1], data
