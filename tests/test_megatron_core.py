"""The megatron_core strategy's pieces, fast and in one process: its CPU stubs, the sharded state
dict the tp_mlp workload gives megatron-core, a real dist_checkpointing save and load of it (one
gloo rank), and the IO trace of a forked writer (what power-loss exploration reads)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from resilience.core.case import WorkloadSpec
from resilience.core.paths import PROJECT_ROOT
from resilience.core.topology import Topology
from resilience.disk.io_trace import TraceWriter, payload_path, read_payload, read_trace
from resilience.strategies.megatron import core_cpu as megatron_core_cpu
from resilience.strategies.megatron.layout import TRACKER, iteration_dir, read_tracker

SPEC = WorkloadSpec(model="tp_mlp", world_size=1, steps=2, checkpoint_every=1, seed=0, global_batch=24,
                    size_bytes=16384, rank_rng="same")


@pytest.fixture
def cuda_calls(monkeypatch):
    """Whatever a test stubs in torch.cuda is put back afterwards."""
    monkeypatch.setattr(torch.cuda, "synchronize", torch.cuda.synchronize)
    monkeypatch.setattr(torch.cuda, "current_device", torch.cuda.current_device)


def test_cpu_stubs_are_the_two_named_calls(cuda_calls, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert megatron_core_cpu.apply_cpu_stubs() == ("torch.cuda.synchronize", "torch.cuda.current_device")
    assert torch.cuda.synchronize() is None
    assert torch.cuda.current_device() == torch.device("cpu")
    total = torch.tensor([1], dtype=torch.int, device=torch.cuda.current_device())  # as its finalize builds it
    assert total.device.type == "cpu"


def test_cpu_stubs_never_applied_where_cuda_exists(cuda_calls, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    synchronize, current_device = torch.cuda.synchronize, torch.cuda.current_device
    assert megatron_core_cpu.apply_cpu_stubs() == ()
    assert torch.cuda.synchronize is synchronize and torch.cuda.current_device is current_device


def test_layout_names():
    assert TRACKER == "latest_checkpointed_iteration.txt"
    assert iteration_dir("/ck", 8).as_posix() == "/ck/iter_0000008"
    assert read_tracker("8\n") == 8 and read_tracker("") is None


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def _trained_workload():
    from resilience.workloads.parallel_mlp import TensorParallelMLP

    workload = TensorParallelMLP(SPEC, 0, 1, topology=Topology(tp=1, pp=1, dp=1, node_ids=(0,)))
    workload.train_step()
    return workload


def test_sharded_state_dict_as_megatron_layers_build_it(one_rank):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install 'resilience[megatron]')")
    from megatron.core.dist_checkpointing import ShardedTensor

    sharded = _trained_workload().sharded_state_dict()
    weight = sharded["model"]["layer1.weight"]
    assert isinstance(weight, ShardedTensor) and weight.key == "model.layer1.weight"
    assert weight.replica_id == (0, 0, 0) and weight.global_shape == weight.local_shape
    moment = sharded["optimizer"]["state"][0]["exp_avg"]  # through optim_state_to_sharding_state
    assert moment.key == "optimizer.state.exp_avg.model.layer1.weight"
    assert "step" not in sharded["optimizer"]["state"][0]  # saved once, as Megatron's common_step
    assert float(sharded["common_step"]) == 1.0 and sharded["iteration"] == 1
    assert set(sharded) == {"model", "optimizer", "common_step", "scheduler", "iteration", "data", "args", "rng"}
    assert sharded["args"] == {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1}


def test_the_rng_is_left_out_of_a_load_at_another_tensor_or_pipeline_size(one_rank):
    """Megatron-LM's load_checkpoint rule (core_v0.16.1 checkpointing.py:1559-1570): the RNG is in
    the load template only where the checkpoint's args name this run's TP and PP (1 where absent)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install 'resilience[megatron]')")
    workload = _trained_workload()
    assert workload.checkpoint_sizes_match({"args": workload.sharded_state_dict()["args"]})
    assert workload.checkpoint_sizes_match({})  # Megatron-LM takes 1 for a size args lack
    assert not workload.checkpoint_sizes_match({"args": {"tensor_model_parallel_size": 2}})
    assert not workload.checkpoint_sizes_match({"args": {"pipeline_model_parallel_size": 3}})
    template = workload.sharded_state_dict(loading=True, with_rng=False)
    assert "rng" not in template and "args" in template


ROUND_TRIP = """
import json, sys
from datetime import timedelta
from pathlib import Path
import torch.distributed as dist
from megatron.core import dist_checkpointing
from resilience.core.topology import Topology
from resilience.strategies.megatron.core_cpu import apply_cpu_stubs
from resilience.strategies.megatron.layout import iteration_dir
from resilience.workloads.parallel_mlp import TensorParallelMLP
from tests.test_megatron_core import SPEC

root = Path(sys.argv[1])
dist.init_process_group("gloo", store=dist.FileStore(str(root / "store"), 1), rank=0, world_size=1,
                        timeout=timedelta(seconds=60))
print(json.dumps(apply_cpu_stubs()))
topology = Topology(tp=1, pp=1, dp=1, node_ids=(0,))
saved = TensorParallelMLP(SPEC, 0, 1, topology=topology)
saved.train_step()
directory = iteration_dir(root, 1)
directory.mkdir()
dist_checkpointing.save(saved.sharded_state_dict(), str(directory))
print(json.dumps(sorted(p.name for p in directory.iterdir())))
print(json.loads((directory / "metadata.json").read_text())["sharded_backend"])
fresh = TensorParallelMLP(SPEC, 0, 1, topology=topology)
fresh.load_sharded(dist_checkpointing.load(fresh.sharded_state_dict(loading=True), str(directory)))
print(fresh.fingerprint() == saved.fingerprint())
dist.destroy_process_group()
"""


def test_save_and_load_round_trip_on_cpu(tmp_path):
    """A real save and load in a process of its own (megatron-core forks writers and starts a
    multiprocessing Manager: none of that in the test process)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install 'resilience[megatron]')")
    if torch.cuda.is_available():
        pytest.skip("the CPU stubs are not applied where CUDA exists (the gpu tests cover that path)")
    result = subprocess.run([sys.executable, "-c", ROUND_TRIP, str(tmp_path)], capture_output=True, text=True,
                            timeout=120, cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    stubbed, files, backend, same = result.stdout.split("\n")[-5:-1]
    assert json.loads(stubbed) == ["torch.cuda.synchronize", "torch.cuda.current_device"]
    assert json.loads(files) == [".metadata", "__0_0.distcp", "__0_1.distcp", "common.pt", "metadata.json"]
    assert backend == "torch_dist" and same == "True"


def test_trace_of_a_forked_writer_merges_into_its_rank(tmp_path):
    writer = TraceWriter(tmp_path, 0)
    writer.follow_forks()
    writer.record(8, "open", path="common.pt", truncate=True)
    pid = os.fork()
    if pid == 0:  # the forked writer: its own trace files, nothing of the rank's buffer repeated
        writer.record(8, "write", b"abc", path="__0_0.distcp", offset=0)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    writer.record(8, "close", path="common.pt")
    writer.close()
    ops, _ = read_trace(tmp_path, 0)
    assert [(op.kind, op.source) for op in ops] == [("open", ""), ("write", f"fork{pid}"), ("close", "")]
    assert [op.seq for op in ops] == [0, 1, 2]
    assert read_payload(payload_path(tmp_path, ops[1]), ops[1]) == b"abc"


def test_a_warm_rank_counts_only_the_child_processes_a_restore_started():
    """megatron-core's writer-results Manager lives as long as its process (``warm_process`` starts it
    before the warm rank's baseline): only a child process new since then retires the rank."""
    from resilience.rank.warm_rank import leftovers

    signals = ["SIG_DFL"]
    baseline = {"threads": ["python"], "children": ["101"], "signals": signals, "groups": 0}
    assert leftovers(baseline, {"threads": ["python"], "children": ["101"], "signals": signals, "groups": 0}) == []
    assert leftovers(baseline, {"threads": ["python"], "children": ["101", "202"], "signals": signals,
                                "groups": 0}) == ["child processes 202"]

