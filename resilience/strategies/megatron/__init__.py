"""Megatron: the seed's ``mp_rank_XX`` scheme (``lm.py``), megatron-core's ``dist_checkpointing``
(``core_checkpoint.py``, with the two CUDA stubs of ``core_cpu.py``), Megatron-DeepSpeed
(``with_deepspeed.py``) and the tensor-parallel file layout they share (``layout.py``)."""
from ..stack import Stack

STACK = Stack(
    name="megatron",
    distributions=("megatron-core",),
    # 2-3 s per rank otherwise (its package init pulls in its tensor-parallel layers); no threads.
    # Its CUDA stubs are applied in the rank (core_cpu.py), never in the fork server.
    preload=("megatron.core.dist_checkpointing", "megatron.core.dist_checkpointing.optimizer",
             "megatron.core.dist_checkpointing.strategies.async_utils",
             "megatron.core.dist_checkpointing.strategies.fully_parallel",
             "megatron.core.dist_checkpointing.strategies.torch",
             "resilience.strategies.megatron.core_checkpoint"),
    requires="megatron.core",
)
