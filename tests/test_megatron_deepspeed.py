"""The megatron_deepspeed strategy's pieces, fast and in one process: the groups it gives DeepSpeed
as ``mpu``, what it refuses before DeepSpeed starts, and Megatron-DeepSpeed's argument check after a
load (the scenarios run the real engine: scenarios/megatron_deepspeed.scenario.yaml)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from resilience.core.topology import Topology
from resilience.strategies.base import StrategyContext
from resilience.strategies.megatron.with_deepspeed import MegatronDeepSpeed
from resilience.strategies.megatron.with_deepspeed_engine import TensorParallelGroups


def _workload(topology: Topology, rank: int, model_parallel: bool = True):
    return SimpleNamespace(topology=topology, rank=rank, coords=topology.coords(rank), model_parallel=model_parallel,
                           tensor_group="tensor group", data_group="data group")


def test_deepspeed_sees_the_tensor_parallel_group_as_its_model_parallel_group():
    topology = Topology(tp=2, pp=1, dp=2, node_ids=(0,))  # ranks 0,1 | 2,3 share tensor groups
    groups = TensorParallelGroups(_workload(topology, 3))
    assert (groups.get_model_parallel_rank(), groups.get_model_parallel_world_size()) == (1, 2)
    assert (groups.get_data_parallel_rank(), groups.get_data_parallel_world_size()) == (1, 2)
    assert groups.get_data_parallel_group_ranks() == [1, 3]
    assert groups.get_tensor_model_parallel_src_rank() == 2
    assert groups.get_model_parallel_group() == "tensor group" and groups.get_data_parallel_group() == "data group"
    assert groups.get_pipeline_model_parallel_world_size() == 1


def _strategy(topology: Topology, rank: int = 0) -> MegatronDeepSpeed:
    return MegatronDeepSpeed(StrategyContext(checkpoint_dir=Path("/nonexistent"), rank=rank,
                                             world_size=topology.world_size, previous_rank=0, topology=topology))


def test_a_data_parallel_workload_or_pipeline_stages_are_refused_before_deepspeed_starts():
    topology = Topology(tp=1, pp=1, dp=2, node_ids=(0,))
    with pytest.raises(TypeError, match="megatron_deepspeed trains a model-parallel workload such as tp_mlp"):
        _strategy(topology).prepare(_workload(topology, 0, model_parallel=False))
    piped = Topology(tp=1, pp=2, dp=1, node_ids=(0,))
    with pytest.raises(ValueError, match="topology.pp is 2; allowed: 1"):
        _strategy(piped).prepare(_workload(piped, 0))


class _LoadedEngine:
    """What DeepSpeed's load_checkpoint returns after it read a checkpoint: (path, client state)."""

    def __init__(self, client_state):
        self.client_state = client_state

    def load_checkpoint(self, load_dir, load_module_strict, tag):
        return load_dir, self.client_state


def test_a_checkpoint_of_another_tensor_parallel_size_is_refused_as_check_checkpoint_args_does():
    strategy = _strategy(Topology(tp=1, pp=1, dp=2, node_ids=(0,)))
    saved_args = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "data_parallel_size": 1}
    strategy.workload = SimpleNamespace(engine=_LoadedEngine({"args": saved_args, "progress": {}}))
    with pytest.raises(AssertionError, match=r"tensor_model_parallel_size value from checkpoint \(2\) is not "
                                             r"equal to the input argument value \(1\)\."):
        strategy.load(None)
