"""The `tp_mlp` workload's state as megatron-core's ``dist_checkpointing`` sees it, built the way
Megatron's layers build theirs (``megatron/core/utils.py``: ``make_tp_sharded_tensor_for_checkpoint``
and ``make_sharded_tensor_for_checkpoint``; ``megatron/core/optimizer/optimizer.py``:
``FP32Optimizer.sharded_state_dict``).

- model: one ``ShardedTensor.from_rank_offsets`` per parameter, keyed ``model.layerN.<name>`` with
  the global layer number N (a pipeline change is a reshard, not a key mismatch); a tensor-parallel
  parameter carries its offset ``(dim, tp_rank, tp)`` and ``replica_id (0, 0, dp_rank)``, a
  replicated one ``replica_id (0, tp_rank, dp_rank)``: only the all-zero replica writes.
- optimizer: Adam's ``exp_avg`` / ``exp_avg_sq`` through megatron-core's own
  ``get_param_id_to_sharded_param_map`` and ``optim_state_to_sharding_state`` (sharded like their
  parameter, keys ``optimizer.state.exp_avg.model.layerN.<name>``); the per-parameter ``step``, which
  Megatron saves once as ``common_step``, and the param groups in the common state.
- common (``common.pt``, rank 0's): step, scheduler, data position.
- ema (with the ``ema`` option): the average, sharded like its parameters (``ema.layerN.<name>``).
- RNG: as Megatron-LM's ``get_rng_state`` (the noise stream, and with dropout the process's torch
  RNG, as its ``torch_rng_state``) (``megatron/training/checkpointing.py`` at
  ``core_v0.16.1``, lines 347-383): one ``ShardedObject('rng_state', states, (pp, tp), (pp_rank,
  tp_rank), replica_id=dp_rank)`` per model-parallel rank, whose list holds every data-parallel
  rank's state (gathered over the data-parallel group) with per-rank streams, as with
  ``--data-parallel-random-init``, and the one replicated state otherwise; a load takes entry
  ``dp_rank`` or entry 0 (lines 1859-1862): a restart with more data-parallel ranks than the
  checkpoint has entries fails as Megatron-LM does (IndexError). A restart at another tensor- or
  pipeline-parallel size leaves the RNG out of its template, as Megatron-LM's ``load_checkpoint``
  does after comparing the sizes in the common state's ``args`` (lines 1542-1570: "(TP, PP)
  mismatch after resume ...: RNG state will be ignored", printed on rank 0): the restart keeps the
  stream it was seeded with.

megatron-core is imported only here, inside the functions: the workload itself never needs it.
The workload (``parallel_mlp.TensorParallelMLP``) calls these from its ``sharded_state_dict``.
"""
from __future__ import annotations

from typing import Any

import torch

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


def sharded_state_dict(workload: Any, loading: bool = False, with_rng: bool = True) -> dict[str, Any]:
    """This rank's sharded state dict; ``loading``: with zeroed Adam moments of the right shapes
    (a fresh process has none yet, as Megatron's ``init_state_fn`` fills them before a load);
    ``with_rng`` False: a load template without the RNG (another TP or PP size than the checkpoint's)."""
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    topology, coords = workload.topology, workload.coords

    def sharded_like_parameter(key: str, name: str, tensor: torch.Tensor) -> Any:
        dim = workload.split_dims[name]
        if dim is None:
            return ShardedTensor.from_rank_offsets(key, tensor, replica_id=(0, coords.tp, coords.dp))
        return ShardedTensor.from_rank_offsets(key, tensor, (dim, coords.tp, topology.tp), replica_id=(0, 0, coords.dp))

    model = {name: sharded_like_parameter(f"model.{name}", name, param)
             for name, param in workload.model.named_parameters()}
    optimizer = workload.optimizer.state_dict()
    params = list(workload.model.parameters())
    if loading or not optimizer["state"]:
        optimizer["state"] = {index: {moment: torch.zeros_like(p) for moment in ADAM_MOMENTS}
                              for index, p in enumerate(params)}
    steps = {float(entry["step"]) for entry in optimizer["state"].values() if "step" in entry}
    if len(steps) > 1:  # as MegatronOptimizer._extract_common_per_param_step
        raise ValueError(f"the optimizer step differs per parameter: {sorted(steps)}")
    id_map = get_param_id_to_sharded_param_map(model, params)
    optim_state_to_sharding_state(optimizer, id_map, exclude_keys=("step",))
    state = {"model": model, "optimizer": optimizer,
             "common_step": torch.tensor(steps.pop() if steps else 0.0),
             "scheduler": workload.scheduler.state_dict(), "iteration": workload.step,
             "data": workload.sampler.state(), "args": parallel_sizes(topology)}
    if workload.average is not None:  # the EMA, sharded like its parameters
        state["ema"] = {name: sharded_like_parameter(f"ema.{name}", name, average)
                        for name, average in workload.average.average.items()}
    if with_rng:
        state["rng"] = rng_state(workload, loading)
    return state


def parallel_sizes(topology: Any) -> dict[str, int]:
    """The sizes Megatron-LM keeps in its common state's ``args`` and compares at load (a dict
    here, not an ``argparse.Namespace``, so ``common.pt`` loads with ``weights_only=True``)."""
    return {"tensor_model_parallel_size": topology.tp, "pipeline_model_parallel_size": topology.pp}


def rng_state(workload: Any, loading: bool) -> Any:
    """Megatron-LM's ``rng_state`` sharded object: every data-parallel rank's state when the
    streams are per rank (gathered, collective over the data-parallel group), else this one."""
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    topology, coords = workload.topology, workload.coords
    states = [workload.own_streams()]
    if workload.rank_local_keys and topology.dp > 1 and not loading:
        states = [None] * topology.dp
        dist.all_gather_object(states, workload.own_streams(), group=workload.data_group)
    return ShardedObject("rng_state", states, (topology.pp, topology.tp), (coords.pp, coords.tp),
                         replica_id=coords.dp)


def state_from_loaded(workload: Any, loaded: dict[str, Any]) -> dict[str, Any]:
    """What ``dist_checkpointing.load`` gave back, as the workload's ``load_state_dict`` takes it."""
    names = [name for name, _ in workload.model.named_parameters()]
    step = loaded["common_step"]
    state = {index: {**{moment: loaded["optimizer"]["state"][index][moment].clone() for moment in ADAM_MOMENTS},
                     "step": step.clone()} for index in range(len(names))}
    return {"model": {name: loaded["model"][name].detach().clone() for name in names},
            "optimizer": {"state": state if float(step) > 0 else {},
                          "param_groups": loaded["optimizer"]["param_groups"]},
            "scheduler": loaded["scheduler"], "step": int(loaded["iteration"]), "data": loaded["data"],
            **(loaded["rng"][workload.coords.dp if workload.rank_local_keys else 0] if "rng" in loaded
               else workload.own_streams()),
            **({"ema": {name: loaded["ema"][name].detach().clone() for name in names}} if "ema" in loaded else {})}
