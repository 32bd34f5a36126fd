"""The topology model, its scenario syntax, and the model-parallel workload under the real harness."""
from __future__ import annotations

import pytest

from resilience.core.case import VerdictKind
from resilience.core.topology import RankCoords, Topology
from resilience.errors import ScenarioError

from .harness_helpers import case_from, run_case

TP_MLP = {"model": "tp_mlp", "world_size": 4, "steps": 8, "checkpoint_every": 4, "seed": 0, "global_batch": 24}


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 4), (2, 1, 2), (2, 2, 2), (3, 2, 1), (1, 3, 2)])
def test_coords_number_ranks_tensor_first_then_data_then_pipeline(tp, pp, dp):
    topology = Topology(tp=tp, pp=pp, dp=dp, node_ids=(0,))
    seen = set()
    for rank in range(topology.world_size):
        coords = topology.coords(rank)
        assert topology.rank_of(coords) == rank
        seen.add((coords.tp, coords.pp, coords.dp))
    assert len(seen) == topology.world_size
    assert topology.coords(1 % topology.world_size).tp == (1 % tp)  # tensor rank varies fastest
    for groups in (topology.tensor_groups(), topology.data_groups(), topology.pipeline_groups()):
        assert sorted(r for g in groups for r in g) == list(range(topology.world_size))  # a partition


def test_nodes_hold_blocks_of_ranks_and_node_local_storage_follows_the_node():
    topology = Topology(tp=2, pp=1, dp=2, node_ids=(5, 3), storage="node_local")
    assert [topology.node_of(r) for r in range(4)] == [5, 5, 3, 3]
    assert [topology.local_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert topology.storage_dir("/ck", 2).as_posix() == "/ck/node3"
    assert Topology(tp=2, pp=1, dp=2, node_ids=(0, 1)).storage_dir("/ck", 3).as_posix() == "/ck"
    assert topology.rank_of(RankCoords(tp=1, pp=0, dp=1)) == 3


@pytest.mark.parametrize("overrides,key,fragment", [
    ({"topology": {"tp": 3}}, "topology.tp", "must divide the world size"),
    ({"topology": {"tp": 2, "nodes": 3}}, "topology.nodes", "must divide the world size"),
    ({"topology": {"tp": 2, "nodes": 2, "node_ids": [1, 1]}}, "topology.node_ids", "distinct"),
    ({"topology": {"tp": 2, "storage": "nfs"}}, "topology.storage", "not one of the allowed values"),
    ({"topology": {"tp": 2, "gpus": 8}}, "topology.gpus", "unknown key"),
    ({"topology": {"tp": 2}, "restart": {"topology": {"tp": 2, "storage": "shared"}}}, "restart.topology.storage",
     "unknown key"),
    ({"topology": {"pp": 4}}, "topology.tp", "pp must be 1, 2 or 3"),
])
def test_bad_topologies_name_the_key(overrides, key, fragment):
    with pytest.raises(ScenarioError) as raised:
        case_from(strategy="megatron", workload=dict(TP_MLP), **overrides)
    assert raised.value.key.startswith(key) and fragment in str(raised.value)


def test_a_pure_data_parallel_workload_refuses_tensor_parallelism():
    with pytest.raises(ScenarioError, match="no tensor or pipeline parallelism") as raised:
        case_from(topology={"tp": 2})
    assert raised.value.key.startswith("topology.tp")


def test_a_new_placement_alone_keeps_the_reference_as_oracle():
    case = case_from(strategy="megatron", workload=dict(TP_MLP), topology={"tp": 2, "nodes": 2},
                     restart={"topology": {"tp": 2, "nodes": 2, "node_ids": [1, 0]}})
    assert not case.topology_changes and case.restart.placement.node_ids == (1, 0)
    changed = case_from(strategy="megatron", workload=dict(TP_MLP), topology={"tp": 2}, restart={"world_size": 2})
    assert changed.topology_changes and changed.restart.placement.parallel == (2, 1, 1)


@pytest.mark.slow
def test_a_rank_zero_save_of_a_tensor_parallel_model_is_silent(tmp_path):
    """Rank 1's shard is never saved; the gathered full state shows rank 0's shard restored twice."""
    result = run_case(tmp_path, strategy="torch.rank0", workload={**TP_MLP, "world_size": 2},
                      topology={"tp": 2}, fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    assert result.verdict.kind is VerdictKind.SILENT
    assert any("model.layer1.weight" in line for line in result.verdict.state_diff)


@pytest.mark.slow
def test_megatron_restores_at_fewer_data_parallel_ranks_against_a_continuation(tmp_path):
    result = run_case(tmp_path, strategy="megatron", workload=dict(TP_MLP), topology={"tp": 2},
                      fault={"kind": "kill", "rank": 3, "step": 6, "phase": "train"}, restart={"world_size": 2})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert [p.name for p in result.phases][-1] == "continuation"
