"""torchtitan as it trains here: a tiny Llama 3 built from torchtitan's own model config and wrapped
by its own FSDP2 parallelisation (``parallelize_llama``), its optimizer and LR scheduler containers,
its stateful dataloader (``ParallelAwareDataloader``) over a synthetic token stream, the train
state it checkpoints, and its checkpoint manager over all of them. What decides the numbers of a
torchtitan-trained run lives here and in ``loop.py``: the reference cache is keyed on both.

Imported only inside rank processes that run with torchtitan layered in (`Case.software`), and
only once ``cpu.install()`` ran (the strategy's ``prepare`` does): the shims must precede the
first import of torchtitan's models and parallel code.
"""
from __future__ import annotations

import pickle
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, ParamGroupConfig
from torchtitan.config import CompileConfig, DebugConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed import utils as dist_utils
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3 import Llama3Model, Llama3StateDictAdapter, parallelize_llama
from torchtitan.models.llama3 import _build_llama3_layers as build_llama3_layers  # its own layer builder

from ...workloads.base import Workload
from . import cpu

VOCABULARY = 128
SEQUENCE = 16  # tokens per sequence
WIDTH = 64  # model dimension: about 120,000 parameters in two layers of four heads
HEADS = 4
LAYERS = 2
MASK_TOKEN = 0  # what ``token_masking`` replaces a token with


def tiny_llama() -> Llama3Model.Config:
    """Llama 3 from torchtitan's own config classes and layer builder, shrunk; initialisers as its
    ``debugmodel`` flavour's. Its flex attention compiles with inductor at class level
    (``models/common/attention.py:277``) and the config refuses SDPA for a language model
    (``config_utils.py:97-101``), so each layer's inner attention is swapped for torchtitan's own
    ``ScaledDotProductAttention`` (causal, no masks) after the config is built."""
    layers = build_llama3_layers(
        n_layers=LAYERS, dim=WIDTH, n_heads=HEADS, hidden_dim=compute_ffn_hidden_dim(WIDTH, multiple_of=32),
        rope=ComplexRoPE.Config(dim=WIDTH // HEADS, max_seq_len=SEQUENCE, theta=10000.0, scaling="none"),
        attn_backend="flex", fuse_qkv=True)
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    deviation = WIDTH ** -0.5
    return Llama3Model.Config(
        dim=WIDTH, vocab_size=VOCABULARY,
        tok_embeddings=Embedding.Config(num_embeddings=VOCABULARY, embedding_dim=WIDTH,
                                        param_init={"weight": partial(nn.init.normal_, std=1.0)}),
        norm=RMSNorm.Config(normalized_shape=WIDTH, param_init={"weight": nn.init.ones_}),
        lm_head=Linear.Config(in_features=WIDTH, out_features=VOCABULARY, param_init={
            "weight": partial(nn.init.trunc_normal_, std=deviation, a=-3 * deviation, b=3 * deviation),
            "bias": nn.init.zeros_}),
        layers=layers)


class TokenStream(IterableDataset):
    """An endless stream of sequences for one data-parallel rank, item ``i`` drawn from ``(seed,
    dp_rank, i)`` alone; its position is its state (what torchtitan's dataloader checkpoints)."""

    def __init__(self, seed: int, dp_rank: int, dp_size: int):
        self.seed, self.dp_rank, self.dp_size, self.position = seed, dp_rank, dp_size, 0

    def __iter__(self):
        while True:
            index = self.position * self.dp_size + self.dp_rank  # a global sample index, for the data audit
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
            start = torch.randint(0, VOCABULARY, (1,), generator=generator)
            stride = torch.randint(1, 4, (1,), generator=generator)
            tokens = (start + stride * torch.arange(SEQUENCE + 1)) % VOCABULARY
            self.position += 1
            yield {"input": tokens[:-1], "index": index}, tokens[1:]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class TrainState:
    """The trainer's own ``train_state`` entry (``trainer.py:1078-1083``): step and tokens seen."""

    def __init__(self) -> None:
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.ntokens_seen = int(state["step"]), int(state["ntokens_seen"])


class TitanTrainedWorkload(Workload):
    """The workload whose steps the torchtitan loop computes, built as torchtitan's trainer builds
    its parts (``trainer.py``: determinism at 335-341, then the model on the meta device,
    ``parallelize_llama``, the weights' init, the optimizer and LR scheduler containers). Its state
    (what fingerprints see): the train state, the model and optimizer gathered whole (collective),
    the LR scheduler, this rank's dataloader position and, where the loop draws from it, the
    process's torch RNG."""

    def __init__(self, spec: Any, rank: int, world_size: int, token_masking: float):
        super().__init__(spec, rank, world_size)
        self.token_masking = token_masking
        dist_utils.set_spmd_backend("partial_dtensor")  # the plain FSDP-mesh path (parallelize.py:73-78)
        self.parallelism = ParallelismConfig(data_parallel_shard_degree=world_size, spmd_backend="partial_dtensor")
        self.parallel_dims = ParallelDims.from_config(self.parallelism, world_size)
        self.parallel_dims.build_mesh()
        dist_utils.set_determinism(self.parallel_dims, torch.device("cpu"), DebugConfig(seed=spec.seed),
                                   distinct_seed_mesh_dims=["pp"])
        self.local_batch = spec.global_batch // world_size
        self.training = TrainingConfig(local_batch_size=self.local_batch, seq_len=SEQUENCE, steps=spec.steps,
                                       mixed_precision_param="float32", max_norm=1.0)
        self.model_config = tiny_llama()
        with torch.device("meta"):
            model = self.model_config.build()
        self.model = parallelize_llama(model, parallel_dims=self.parallel_dims, training=self.training,
                                       parallelism=self.parallelism, compile_config=CompileConfig(enable=False),
                                       ac_config=None, dump_folder="")
        cpu.sum_reductions(self.model)
        self.model.to_empty(device="cpu")
        with torch.no_grad():
            self.model.init_weights(buffer_device=None)
        self.model.train()
        self.optimizers = OptimizersContainer.Config(param_groups=[ParamGroupConfig(
            pattern=r".*", optimizer_name="AdamW",
            optimizer_kwargs={"lr": 8e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1})],
        ).build(model_parts=[self.model])
        self.lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2, decay_type="linear").build(
            optimizers=self.optimizers, training_steps=spec.steps)
        self.dataloader = ParallelAwareDataloader(TokenStream(spec.seed, rank, world_size), dp_rank=rank,
                                                  dp_world_size=world_size, batch_size=self.local_batch)
        self.train_state = TrainState()

    @property
    def step(self) -> int:
        return self.train_state.step

    def train_step(self) -> float:
        raise NotImplementedError("the torchtitan loop computes the steps of a torchtitan-trained workload")

    def state_dict(self) -> dict[str, Any]:
        """Collective: every sharded tensor is gathered whole. The optimizer's state is torchtitan's
        own flattened view of it (``OptimizersContainer.state_dict``), as the checkpoint holds it."""
        state = {"train_state": self.train_state.state_dict(), "model": whole(self.model.state_dict()),
                 "optimizer": whole(self.optimizers.state_dict()), "lr_scheduler": self.lr_schedulers.state_dict(),
                 "dataloader": self.loader_state()}
        if self.token_masking:
            state["torch_rng"] = torch.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError("torchtitan's checkpoint manager restores its own checkpoints")

    def loader_state(self) -> dict[str, Any]:
        """This rank's entry of what torchtitan checkpoints of its dataloader
        (``ParallelAwareDataloader.state_dict``: the ``StatefulDataLoader``'s state, pickled under
        ``dp_rank_<r>``), unpickled: bytes this process made, never read from a file. A restored
        loader applies it to the data set only when iterated, so the data set's own position would
        still read 0 right after a restore."""
        return pickle.loads(self.dataloader.state_dict()[f"dp_rank_{self.rank}"])

    def manager(self, base_folder: str, **config: Any) -> CheckpointManager:
        """torchtitan's checkpoint manager over this workload's parts, built as the trainer builds
        it (``trainer.py:591-603``: the model parts, the optimizer and LR scheduler containers, the
        dataloader, ``states={"train_state": ...}``; the llama3 state-dict adapter, without Hugging Face
        assets, only for ``last_save_in_hf``) with ``config`` its
        ``checkpoint`` section (``folder`` is torchtitan's default, ``checkpoint``). Collective in
        the async modes, which make a gloo group of their own (``checkpointer/dcp.py:188-189``)."""
        adapter = Llama3StateDictAdapter(self.model_config, None) if config.get("last_save_in_hf") else None
        return CheckpointManager(CheckpointManager.Config(**config), dataloader=self.dataloader,
                                 model_parts=[self.model], optimizers=self.optimizers,
                                 lr_schedulers=self.lr_schedulers, states={"train_state": self.train_state},
                                 sd_adapter=adapter, base_folder=base_folder)

    def save_reference_snapshot(self, directory) -> None:
        """The reference's own state as torchtitan checkpoints it (every part, synchronously) under
        ``directory``; the continuation restores it with ``load(step)``. Collective."""
        snapshot = self.manager(str(directory), enable=True, interval=1, keep_latest_k=0)
        try:
            snapshot.save(self.step, last_step=False)
        finally:
            snapshot.close()


def whole(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each DTensor gathered into a full tensor (collective), in key order."""
    from torch.distributed.tensor import DTensor

    return {key: whole(value) if isinstance(value, dict) else
            value.full_tensor() if isinstance(value, DTensor) else value for key, value in sorted(state.items())}
