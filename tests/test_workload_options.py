"""The `mlp` workload's options (`resilience.workloads.options`): dropout on the process's torch RNG,
an EMA of the weights, gradient accumulation, a real DataLoader with workers; how the scenario
loader refuses bad values and strategies that do not carry an option; and what the oracle sees."""
from __future__ import annotations

import pytest
import torch

from resilience.core.case import VerdictKind, WorkloadSpec
from resilience.workloads.loader import LoaderData
from resilience.workloads.mlp import MLPWorkload
from resilience.workloads.parallel_extras import DropoutMasks

from .test_loader import load, scenario_error, variant

FULL = {"dropout": 0.1, "ema": 0.9, "accumulation": 2, "amp": "fp16", "buffers": True, "data": "loader",
        "num_workers": 2, "persistent_workers": True, "epoch_steps": 5}


@pytest.mark.parametrize("options, key, value, allowed", [
    ({"depth": 3}, "workload.options.depth", "depth", "dropout"),
    ({"dropout": 1.5}, "workload.options.dropout", 1.5, "[0, 1)"),
    ({"ema": 1}, "workload.options.ema", 1, "(0, 1)"),
    ({"accumulation": 0}, "workload.options.accumulation", 0, "1..64"),
    ({"accumulation": 3}, "workload.options.accumulation", 3, "divides global_batch / world_size"),
    ({"data": "stream"}, "workload.options.data", "stream", "sampler, loader"),
    ({"amp": "fp8"}, "workload.options.amp", "fp8", "bf16, fp16"),
    ({"buffers": 1}, "workload.options.buffers", 1, "true, false"),
    ({"data": "loader", "loader_state": "shared"}, "workload.options.loader_state", "shared", "replicated, per_rank"),
    ({"loader_state": "per_rank"}, "workload.options.loader_state", "per_rank", "data: loader"),
    ({"num_workers": 2}, "workload.options.num_workers", 2, "data: loader"),
    ({"data": "loader", "persistent_workers": True}, "workload.options.persistent_workers", True, "num_workers >= 1"),
    ({"persistent_workers": "yes", "data": "loader"}, "workload.options.persistent_workers", "yes", "true, false"),
    ({"step_seconds": -1}, "workload.options.step_seconds", -1, "[0, 60]"),
    ({"step_seconds": "1s"}, "workload.options.step_seconds", "1s", "[0, 60]"),
])
def test_a_bad_option_is_named_with_what_is_allowed(options, key, value, allowed):
    err = scenario_error(variant({"workload.options": options}))
    assert (err.key, err.value) == (key, value), str(err)
    assert allowed in str(err.allowed), str(err)


@pytest.mark.parametrize("strategy, options, key, allowed", [
    ("lightning", {"amp": "bf16"}, "workload.options.amp", "accumulation, buffers, dropout, ema, tied"),
    ({"name": "lightning", "options": {"module": "tests.lightning_user_modules:TinyRegression"}}, {"dropout": 0.1},
     "workload.options.dropout", "no workload options"),
    ("accelerate", {"data": "loader"}, "workload.options.data", "accumulation, buffers, dropout, ema, tied"),
    ("hf_trainer", {"ema": 0.9}, "workload.options.ema", "no workload options"),
    ("deepspeed.zero1", {"accumulation": 2}, "workload.options.accumulation", "dropout"),
    ("deepspeed.zero3", {"ema": 0.9}, "workload.options.ema", "data"),
    ("deepspeed.zero2", {"buffers": True}, "workload.options.buffers", "dropout"),
    ("dcp", {"amp": "bf16"}, "workload.options.amp", "buffers"),
    ({"name": "manifest", "options": {"inner": "deepspeed.zero2"}}, {"accumulation": 2},
     "workload.options.accumulation", "ema"),
])
def test_a_strategy_that_does_not_train_with_an_option_refuses_it_by_name(strategy, options, key, allowed):
    err = scenario_error(variant({"strategy": strategy, "workload.options": options}))
    assert err.key == key, str(err)
    assert "does not train with this option" in str(err) and allowed in str(err.allowed), str(err)


def test_per_rank_streams_are_refused_where_a_library_trains_its_own_model():
    err = scenario_error(variant({"strategy": "accelerate", "workload.rank_rng": "distinct"}))
    assert (err.key, err.value) == ("workload.rank_rng", "distinct"), str(err)


def test_options_are_checked_again_at_the_restart_world_size():
    err = scenario_error(variant({"workload.options": {"accumulation": 4}, "workload.global_batch": 16,
                                  "restart.world_size": 8}))
    assert err.key == "restart.world_size" and "micro-batch" in str(err), str(err)


def test_the_tensor_parallel_workload_takes_the_options_a_split_keeps_meaningful():
    parallel = {"workload.model": "tp_mlp", "strategy": "megatron", "topology": {"tp": 2}, "workload.world_size": 4}
    load(variant({**parallel, "workload.options": {"dropout": 0.1, "ema": 0.9, "accumulation": 2}}))
    err = scenario_error(variant({**parallel, "workload.options": {"data": "loader"}}))
    assert err.key == "workload.options.data" and "not an option of workload tp_mlp" in str(err), str(err)
    assert err.allowed == "dropout, ema, accumulation", str(err)
    err = scenario_error(variant({**parallel, "workload.options": {"accumulation": 3}}))
    assert err.key == "workload.options.accumulation", str(err)
    engine = {**parallel, "strategy": "megatron_deepspeed"}
    err = scenario_error(variant({**engine, "workload.options": {"accumulation": 2}}))
    assert err.key == "workload.options.accumulation" and "does not train with this option" in str(err), str(err)


def test_tensor_parallel_dropout_keeps_each_ranks_columns_of_one_global_mask():
    """Every tensor-parallel rank draws the whole global micro-batch's mask from the same stream
    and keeps its rows and columns: the split changes which rank applies a mask entry, never the
    entry, so the trajectory does not depend on the topology."""
    hidden, global_rows = 8, 6

    def masks(tp: int, tp_rank: int, rows: slice) -> list[torch.Tensor]:
        width = hidden // tp
        dropout = DropoutMasks(0.5, hidden, slice(tp_rank * width, (tp_rank + 1) * width), per_rank=False)
        torch.manual_seed(7)
        dropout.draw(global_rows, rows)
        ones = torch.ones(rows.stop - rows.start, hidden)
        return [dropout.apply(0, ones[:, dropout.tp_slice], sliced=True), dropout.apply(1, ones, sliced=False)]

    whole = masks(1, 0, slice(0, global_rows))
    halves = [masks(2, tp_rank, slice(0, global_rows)) for tp_rank in range(2)]
    assert torch.equal(torch.cat([half[0] for half in halves], dim=1), whole[0])
    assert all(torch.equal(half[1], whole[1]) for half in halves)
    data_parallel = [masks(1, 0, slice(start, start + 3)) for start in (0, 3)]
    assert torch.equal(torch.cat([rank[0] for rank in data_parallel]), whole[0])
    assert 0 < int((whole[0] == 0).sum()) < whole[0].numel()  # a mask that drops some and keeps some


def test_a_kill_between_micro_steps_needs_a_workload_or_strategy_that_accumulates():
    micro = {"fault": {"kind": "kill", "rank": 1, "step": 10, "phase": "train", "point": "micro_step"}}
    err = scenario_error(variant(micro))
    assert err.key == "fault.point" and "workload.options.accumulation >= 2" in str(err.allowed), str(err)
    case = load(variant({**micro, "workload.options": {"accumulation": 2}})).cases[0]
    assert case.fault.trigger.point == "micro_step"


def spec(**options) -> WorkloadSpec:
    return WorkloadSpec(model="mlp", world_size=2, steps=12, checkpoint_every=4, seed=0, global_batch=8,
                        size_bytes=4096, rank_rng="same", options=options)


def test_without_options_the_state_holds_what_it_always_held():
    workload = MLPWorkload(spec(), rank=0, world_size=2)
    assert set(workload.state_dict()) == {"model", "optimizer", "scheduler", "step", "data", "rng"}
    full = MLPWorkload(spec(**{**FULL, "num_workers": 0, "persistent_workers": False}), rank=0, world_size=2)
    assert set(full.state_dict()) == {"model", "optimizer", "scheduler", "step", "data", "rng", "torch_rng", "ema",
                                      "scaler"}
    assert full.state_dict()["data"] == {"epoch": 0, "batch": 0}
    assert full.state_dict()["scaler"]["scale"] == 2.0 ** 20
    assert [type(m).__name__ for m in full.model] == ["Linear", "Tanh", "RunningCenter", "RowDropout", "Linear",
                                                      "Tanh", "RowDropout", "Linear"]
    assert {"2.running_mean", "2.updates"} <= set(full.state_dict()["model"])


def loader_steps(world_size: int, steps: int, num_workers: int = 0) -> list[set[int]]:
    """The examples each global micro-batch holds: the union of every rank's micro-batch."""
    inputs, targets = torch.randn(40, 3), torch.randn(40, 1)  # 5 micro-batches of 8 an epoch
    ranks = [LoaderData(inputs, targets, 0, rank, world_size, 8 // world_size, num_workers, False)
             for rank in range(world_size)]
    batches = []
    for _ in range(steps):
        drawn = [data.next_micro_batch() for data in ranks]
        batches.append({int(i) for indices, *_ in drawn for i in indices})
        for rank, (indices, _, _, rows) in enumerate(drawn):  # rank r holds positions r, r + world, ...
            assert rows.tolist() == [rank + world_size * k for k in range(len(indices))]
    for data in ranks:
        data.close()
    return batches


def test_the_loader_deals_the_same_global_micro_batches_at_every_world_size_across_epochs():
    one, two, four = loader_steps(1, 12), loader_steps(2, 12), loader_steps(4, 12)
    assert one == two == four
    assert set().union(*one[:5]) == set(range(40)) and one[5] != one[0]  # epoch 1 is reshuffled


def test_a_loader_resumed_mid_epoch_with_workers_continues_the_uninterrupted_order():
    inputs, targets = torch.randn(40, 3), torch.randn(40, 1)
    straight = LoaderData(inputs, targets, 0, 1, 2, 4, 2, True)
    expected = [straight.next_micro_batch()[0].tolist() for _ in range(13)]
    first = LoaderData(inputs, targets, 0, 1, 2, 4, 2, True)
    for _ in range(7):
        first.next_micro_batch()
    saved = first.state()
    assert saved == {"epoch": 1, "batch": 2}
    assert first.sampler.handed_out > 2 * 4  # the workers fetched ahead of what was trained
    resumed = LoaderData(inputs, targets, 0, 1, 2, 4, 2, True)
    resumed.load(saved)
    assert [resumed.next_micro_batch()[0].tolist() for _ in range(6)] == expected[7:]
    for data in (straight, first, resumed):
        data.close()


def test_the_data_audit_names_the_batches_prefetched_workers_skipped_and_nothing_for_the_twin(tmp_path):
    """A mid-epoch resume with num_workers 2: the planted strategy saved the loader position its
    sampler counted (the workers' prefetch, four micro-batches ahead of training), so the restart
    skips micro-batches no step trained; the audit names them by their positions in the epoch. The
    correct per-rank save, in the same case, recovers with no finding."""
    from .harness_helpers import run_case

    case = {"workload": {"model": "mlp", "world_size": 2, "steps": 12, "checkpoint_every": 4, "seed": 0,
                         "global_batch": 8, "options": {"accumulation": 2, "data": "loader", "num_workers": 2,
                                                        "epoch_steps": 16}},
            "fault": {"kind": "kill", "rank": 1, "step": 10, "phase": "train", "point": "micro_step"}}
    planted = run_case(tmp_path / "planted", strategy="resilience.planted.workload_bugs:CountsPrefetchedBatches",
                       **case)
    assert planted.verdict.kind == VerdictKind.SILENT, planted.verdict.findings
    data = [line for line in planted.verdict.findings if line.startswith("data:")]
    # restored at step 8: steps 1..8 trained micro-batches 0..15 of epoch 0's 32 (4 examples each
    # over both ranks); the sampler had handed 4 more to the workers, so the restart resumes at
    # micro-batch 20 and positions 64..79 are never trained
    assert any("16 samples at positions 64..79 of epoch 0 were never trained" in line for line in data), data
    twin = run_case(tmp_path / "twin", strategy="torch.per_rank", **case)
    assert twin.verdict.kind == VerdictKind.RECOVERED, twin.verdict.findings
    assert not [line for line in twin.verdict.findings if line.startswith("data:")]


def test_the_prefetch_count_is_exact_without_workers():
    """The count a resumable sampler saves equals what was trained only when nothing prefetches:
    the planted bug hides at num_workers 0."""
    inputs, targets = torch.randn(40, 3), torch.randn(40, 1)
    data = LoaderData(inputs, targets, 0, 0, 2, 4, 0, False)
    for _ in range(3):
        data.next_micro_batch()
    assert data.sampler.handed_out == 3 * 4
    data.close()


def test_a_stale_buffer_is_caught_only_where_a_buffer_is_updated_out_of_place(tmp_path):
    """The planted save that writes the model's state dict it took at the first save: every
    tensor the model updates in place is saved fresh, so without ``buffers`` it recovers; with
    them the out-of-place update counter is saved stale, and the state digest names it."""
    from .harness_helpers import run_case

    strategy = "resilience.planted.workload_bugs:CachesModelStateDict"
    fault = {"kind": "kill", "rank": 1, "step": 10, "phase": "train"}
    workload = {"steps": 12, "checkpoint_every": 4}
    hidden = run_case(tmp_path / "plain", strategy=strategy, fault=fault, workload=workload)
    assert hidden.verdict.kind == VerdictKind.RECOVERED, hidden.verdict.findings
    caught = run_case(tmp_path / "buffers", strategy=strategy, fault=fault,
                      workload={**workload, "options": {"buffers": True}})
    assert caught.verdict.kind == VerdictKind.SILENT
    assert "model.2.updates" in caught.verdict.findings[0], caught.verdict.findings


def test_a_per_rank_loader_position_is_kept_under_the_ranks_own_key_as_torchtitan_keeps_it(capsys):
    inputs, targets = torch.randn(40, 3), torch.randn(40, 1)
    first = LoaderData(inputs, targets, 0, 1, 2, 4, 0, False, per_rank_state=True)
    for _ in range(3):
        first.next_micro_batch()
    assert first.state() == {"dp_rank_1": {"epoch": 0, "batch": 3}, "world_size": 2}
    other = LoaderData(inputs, targets, 0, 1, 2, 4, 0, False, per_rank_state=True)
    other.load({"dp_rank_0": {"epoch": 0, "batch": 3}, "world_size": 2})  # rank 0's state only
    assert other.state()["dp_rank_1"] == {"epoch": 0, "batch": 0}
    assert "DataLoader state is empty for dp rank 1, expected key dp_rank_1" in capsys.readouterr().err
    wider = LoaderData(inputs, targets, 0, 1, 4, 2, 0, False, per_rank_state=True)
    with pytest.raises(AssertionError, match="dp_degree is inconsistent before and after checkpoint"):
        wider.load(first.state())


def test_a_paced_step_lasts_its_seconds_and_changes_no_bit(tmp_path):
    """``step_seconds`` sleeps after a step's compute: the same losses bit for bit as without it, and
    no two steps of a rank closer together than the pace (a lower bound: a sleep never ends early)."""
    from .harness_helpers import run_case

    fault = {"kind": "kill", "rank": 1, "step": 3, "phase": "train"}
    plain = run_case(tmp_path / "plain", fault=fault, workload={"steps": 4, "checkpoint_every": 2})
    paced = run_case(tmp_path / "paced", fault=fault,
                     workload={"steps": 4, "checkpoint_every": 2, "options": {"step_seconds": 0.3}})
    assert paced.verdict.kind == plain.verdict.kind == VerdictKind.RECOVERED, paced.verdict.findings
    for name in ("reference", "restart"):
        assert paced.loss_series(name) == plain.loss_series(name) != {}
        times = [e["time"] for e in paced.phase(name).ranks[0].events if e["event"] == "loss"]
        gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        assert gaps and min(gaps) >= 0.3, times
