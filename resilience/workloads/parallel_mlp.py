"""The `mlp` workload split the way Megatron-LM splits a transformer's MLP: real tensor parallelism
(a column-parallel then a row-parallel linear layer over the tensor-parallel group), optional
pipeline stages (activations and their gradients sent between stages), data parallelism over the
rest of the ranks.

A rank's ``state_dict`` is its own shard, as a model-parallel checkpoint holds it; its
``fingerprint`` digests the full model and optimizer state gathered from every shard, so a restore
on another topology is compared bitwise with the reference at the same step.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..core.case import WorkloadSpec
from ..core.device import rank_device
from ..core.topology import Topology
from .base import Workload, flatten_state, tensor_digest
from .data import ShuffledSampler, synthetic_dataset
from .extra_state import WeightAverage
from .mlp import hidden_width, lr_factor, sum_gradients
from .options import TrainingExtras
from .parallel_extras import DropoutMasks, parallel_option_problem
from .parallel_mlp_full import full_state, load_snapshot, save_snapshot
from .tensor_parallel import StageModule, SumOverTensorGroup, own_group, pipeline_pass

# Three blocks of layers; a pipeline of pp stages holds them as STAGE_BLOCKS[pp][stage].
STAGE_BLOCKS = {1: ((0, 1, 2),), 2: ((0, 1), (2,)), 3: ((0,), (1,), (2,))}
BLOCK_PARAMS = {0: ("layer1.weight", "layer1.bias"), 1: ("layer2.weight", "layer2.bias"),
                2: ("layer3.weight", "layer3.bias")}
# The dimension a parameter is split along over the tensor-parallel group (None: replicated).
SPLIT_DIM = {"layer1.weight": 0, "layer1.bias": 0, "layer2.weight": 1, "layer2.bias": None,
             "layer3.weight": None, "layer3.bias": None}
HIDDEN_MULTIPLE = 24  # hidden width divisible by tp = 1, 2, 3, 4, 6, 8, 12, 24


class TensorParallelMLP(Workload):
    """A tanh MLP (input -> hidden -> hidden -> 1) with Adam and the `mlp` LR schedule, trained on
    the `mlp` dataset; layer 1 is column-parallel, layer 2 row-parallel, layer 3 replicated.

    Every rank builds the full initial model from the seed and keeps its shard, so the full state
    never depends on the topology; only the bits of the sums (the tensor-parallel all-reduce and
    the data-parallel gradient all-reduce) do. Input noise: one stream for the job (``rank_rng:
    same``) or one per data-parallel rank (``distinct``, Megatron's ``data_parallel_random_init``);
    tensor-parallel and pipeline peers of a data-parallel rank draw the same noise. Options
    (`parallel_extras`): ``dropout``, ``ema`` and ``accumulation``.
    """

    model_parallel = True
    split_dims = SPLIT_DIM
    input_dim = 32
    dataset_size = 512
    noise_scale = 0.05
    base_lr = 1e-3

    @classmethod
    def hidden_width(cls, spec: WorkloadSpec) -> int:
        return max(HIDDEN_MULTIPLE, hidden_width(spec.size_bytes, cls.input_dim) // HIDDEN_MULTIPLE * HIDDEN_MULTIPLE)

    @classmethod
    def check_options(cls, options: Mapping[str, Any], world_size: int,
                      global_batch: int) -> tuple[str, str, Any, Any] | None:
        return parallel_option_problem(options, world_size, global_batch)

    @classmethod
    def topology_problem(cls, spec: WorkloadSpec, tp: int, pp: int) -> str | None:
        if pp not in STAGE_BLOCKS:
            return f"tp_mlp has 3 layer blocks: pp must be 1, 2 or 3, not {pp}"
        hidden = cls.hidden_width(spec)
        if hidden % tp:
            return f"tp={tp} does not divide the hidden width {hidden} of size {spec.size_bytes} B"
        return None

    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int, topology: Topology | None = None):
        super().__init__(spec, rank, world_size, topology)
        topo = self.topology
        problem = self.topology_problem(spec, topo.tp, topo.pp) or (
            None if topo.world_size == world_size else f"topology {topo.describe()} is not {world_size} ranks")
        if problem:
            raise ValueError(problem)
        self.coords = topo.coords(rank)
        self.tensor_group = own_group(topo.tensor_groups(), rank)
        self.data_group = own_group(topo.data_groups(), rank)
        self.pipeline_ranks = next(g for g in topo.pipeline_groups() if rank in g)
        self.pipeline_group = own_group(topo.pipeline_groups(), rank)
        self.blocks = STAGE_BLOCKS[topo.pp][self.coords.pp]
        self.hidden = self.hidden_width(spec)
        self.local_batch = spec.global_batch // topo.dp
        self.extras = extras = TrainingExtras.parse(spec.options)
        if self.local_batch % extras.accumulation:
            raise ValueError(f"{extras.accumulation} micro-batches do not split the {self.local_batch} examples "
                             f"of each of {topo.dp} data-parallel ranks")
        self.micro_batch = self.local_batch // extras.accumulation

        self.device = torch.device(rank_device())  # cuda:LOCAL_RANK under NCCL, else the CPU
        torch.manual_seed(spec.seed)  # the full model, identical on every rank, then this rank's shard
        full = [torch.nn.Linear(self.input_dim, self.hidden), torch.nn.Linear(self.hidden, self.hidden),
                torch.nn.Linear(self.hidden, 1)]
        self.model = StageModule(self.run_blocks)
        for block in self.blocks:
            layer = torch.nn.Module()
            for name in BLOCK_PARAMS[block]:
                attribute = name.split(".")[1]
                full_tensor = getattr(full[block], attribute).detach()
                layer.register_parameter(attribute, torch.nn.Parameter(self.shard(name, full_tensor).to(self.device)))
            self.model.add_module(f"layer{block + 1}", layer)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.base_lr, foreach=False)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor)
        self.average = WeightAverage(self.model, extras.ema) if extras.ema is not None else None

        inputs, targets = synthetic_dataset(spec.seed, self.dataset_size, self.input_dim)
        self.inputs, self.targets = inputs.to(self.device), targets.to(self.device)
        distinct = spec.rank_rng == "distinct"
        stream_seed = spec.seed + 2 + ((self.coords.dp + 1) * 7919 if distinct else 0)
        self.rng = torch.Generator().manual_seed(stream_seed)
        self.dropout = None
        if extras.dropout:  # the process's own stream, which dropout draws from
            torch.manual_seed(stream_seed + 1)
            width = self.hidden // topo.tp
            self.dropout = DropoutMasks(extras.dropout, self.hidden,
                                        slice(self.coords.tp * width, (self.coords.tp + 1) * width), distinct)
        self.rank_local_keys = (("rng", "torch_rng") if extras.dropout else ("rng",)) if distinct else ()
        self._step = 0
        self.sampler = ShuffledSampler(spec.seed, self.dataset_size, spec.global_batch)

    # -- sharding ---------------------------------------------------------------------------------
    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's tensor-parallel slice of a full parameter (or of its Adam moment)."""
        dim = SPLIT_DIM[name]
        if dim is None:
            return full.clone()
        width = full.shape[dim] // self.topology.tp
        return full.narrow(dim, self.coords.tp * width, width).clone()

    def _params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())
    # -- training ---------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self._step

    def micro_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The next step's micro-batches for this rank, (inputs, targets) each: micro-batch m is the
        m-th slice of the global batch, of which each data-parallel rank holds a contiguous run of
        rows. Tells ``micro_step_listener`` between them, and records the step's samples at the end."""
        indices = self.sampler.next_indices()
        count = self.extras.accumulation
        global_micro = self.spec.global_batch // count
        rows = slice(self.coords.dp * self.micro_batch, (self.coords.dp + 1) * self.micro_batch)
        samples: list[int] = []
        for index in range(count):
            if index and self.micro_step_listener is not None:
                self.micro_step_listener(self._step + 1)
            local = indices[index * global_micro:(index + 1) * global_micro][rows]
            samples += local.tolist()  # the rows gathered below: what this step trains on
            if self.spec.rank_rng == "same":
                noise = torch.randn(global_micro, self.input_dim, generator=self.rng)[rows]
            else:
                noise = torch.randn(self.micro_batch, self.input_dim, generator=self.rng)
            if self.dropout is not None:
                self.dropout.draw(global_micro, rows)
            local = local.to(self.device)  # the data order and the noise stream stay on the CPU
            yield self.inputs[local] + self.noise_scale * noise.to(self.device), self.targets[local]
        self.last_samples = samples

    def next_local_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's whole batch of the next step, for an engine that takes one a step."""
        (batch,) = list(self.micro_batches())
        return batch

    def _block(self, block: int, x: torch.Tensor) -> torch.Tensor:
        layer = getattr(self.model, f"layer{block + 1}")
        if block == 0:  # column-parallel: this rank's slice of the hidden units
            hidden = torch.tanh(F.linear(x, layer.weight, layer.bias))
        elif block == 1:  # row-parallel: partial products summed over the tensor-parallel group
            partial = F.linear(x, layer.weight)
            total = SumOverTensorGroup.apply(partial, self.tensor_group) if self.topology.tp > 1 else partial
            hidden = torch.tanh(total + layer.bias)
        else:
            return F.linear(x, layer.weight, layer.bias)
        return hidden if self.dropout is None else self.dropout.apply(block, hidden, sliced=block == 0)

    def run_blocks(self, activation: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            activation = self._block(block, activation)
        return activation

    def train_step(self) -> float:
        self.optimizer.zero_grad(set_to_none=False)
        local_loss = torch.zeros(1, device=self.device)
        for inputs, targets in self.micro_batches():  # gradients accumulate, one reduction a step
            local_loss += pipeline_pass(self, inputs, targets)
        loss_value = sum_gradients(self.model.parameters(), local_loss, self.data_group,
                                    reduce=self.topology.dp > 1)
        self.optimizer.step()
        self.scheduler.step()
        self.count_step()
        if self.topology.pp > 1:  # the last stage computed the loss; every rank reports it
            dist.broadcast(loss_value, src=self.pipeline_ranks[-1], group=self.pipeline_group)
        return float(loss_value)

    def count_step(self) -> None:
        """An optimizer step finished (this workload's own, or an engine's that drives it)."""
        if self.average is not None:
            self.average.update(self.model)
        self._step += 1

    # -- state ------------------------------------------------------------------------------------
    def progress_state(self) -> dict[str, Any]:
        state = {"step": self._step, "data": self.sampler.state(), **self.own_streams()}
        if self.average is not None:
            state["ema"] = self.average.state_dict()  # this rank's shard of the average
        return state

    def own_streams(self) -> dict[str, torch.Tensor]:
        """The noise generator's state, and with dropout the process's torch RNG's."""
        return {"rng": self.rng.get_state(), **({"torch_rng": torch.get_rng_state()} if self.dropout else {})}

    def load_progress_state(self, state: dict[str, Any]) -> None:
        self.sampler.load(state["data"])
        self.rng.set_state(state["rng"])
        if self.dropout is not None:
            torch.set_rng_state(state["torch_rng"])
        if self.average is not None:
            self.average.load_state_dict(state["ema"])
        self._step = int(state["step"])

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: what a model-parallel checkpoint holds for it."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), **self.progress_state()}

    def sharded_state_dict(self, loading: bool = False, with_rng: bool = True) -> dict[str, Any]:
        """This rank's state as megatron-core's dist_checkpointing saves and loads it
        (``parallel_mlp_sharded``); ``loading``: a template to load into, ``with_rng`` False:
        without the RNG."""
        from .parallel_mlp_sharded import sharded_state_dict

        return sharded_state_dict(self, loading, with_rng)

    def checkpoint_sizes_match(self, common: dict[str, Any]) -> bool:
        """Whether a checkpoint's common state names this workload's tensor- and pipeline-parallel
        sizes (Megatron-LM takes 1 where ``args`` lacks them)."""
        from .parallel_mlp_sharded import parallel_sizes

        saved = common.get("args", {})
        return all(saved.get(key, 1) == size for key, size in parallel_sizes(self.topology).items())

    def load_sharded(self, loaded: dict[str, Any]) -> None:
        """Restore what ``dist_checkpointing.load`` gave back for ``sharded_state_dict(loading=True)``."""
        from .parallel_mlp_sharded import state_from_loaded

        self.load_state_dict(state_from_loaded(self, loaded))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])  # strict: a missing key or another shard shape raises
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.load_progress_state(state)

    def full_state(self, held: dict[str, dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:
        """The unsharded state, gathered from every shard (collective; `parallel_mlp_full`)."""
        return full_state(self, held)

    def fingerprint(self) -> dict[str, str]:
        state = {**self.full_state(), **self.own_streams()}
        return {key: tensor_digest(value) for key, value in flatten_state(state)}

    def save_reference_snapshot(self, directory: Path) -> None:
        """One full copy per data-parallel rank (its streams differ with ``distinct``)."""
        save_snapshot(self, self.full_state(), directory)

    def load_reference_snapshot(self, directory: Path) -> None:
        """Slice the trusted full state for this rank's place in this phase's topology."""
        full, progress = load_snapshot(directory, self)
        names = list(self._params())
        self.model.load_state_dict({n: self.shard(n, full["model"][n]) for n in names})
        optimizer_state = {index: {k: (v if k == "step" else self.shard(n, v))
                                   for k, v in full["optimizer"]["state"][n].items()}
                           for index, n in enumerate(names) if full["optimizer"]["state"][n]}
        self.optimizer.load_state_dict({"state": optimizer_state, "param_groups": [
            {**full["optimizer"]["group"], "params": list(range(len(names)))}]})
        self.scheduler.load_state_dict(full["scheduler"])
        self.load_state_dict({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                              "scheduler": full["scheduler"], **progress})
