"""DLRover's flash checkpoint as the system under test: dlrover 0.6.1's real ``DdpCheckpointer``
(``trainer/torch/flash_checkpoint/ddp.py``) in the ranks, its saver in the node agent the harness
keeps beside them (``agent.py``).

Every checkpoint step copies the workload's state into the node's shared memory
(``StorageType.MEMORY``: ``FullCheckpointEngine.save_to_memory``, full_ckpt_engine.py:99-116); a step
that is a multiple of ``storage_every`` also has the node's agent persist it
(``StorageType.DISK``: full_ckpt_engine.py:118-145), which writes ``<dir>/<step>/rank_0.pt`` in the
background and, once every node reported its shard done, the tracker ``dlrover_latest.txt``. A
restart calls ``load_checkpoint()``: the shared memory first when every rank holds the same step
(engine.py:375-390), else the tracker's step from storage (full_ckpt_engine.py:194-217), else
nothing: training starts over (what DLRover's ``{}`` means to a training script).
With DDP, local rank 0 of each node writes the memory and every local rank reads that one segment.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from ...core.capabilities import Capability
from ...core.node_agents import agent_dir, agent_name
from ...core.waiting import wait_until
from ...workloads.base import Workload
from ..base import CheckpointStrategy
from . import PACKAGES, dlrover_environment, use_node_sockets

TRACKER = "dlrover_latest.txt"  # the newest persisted step, written by node 0's agent
STEP_KEY = "flash_step"  # beside the workload's state: the step the checkpointer was given
SAVE_TIMEOUT_S = 30  # how long node 0's agent waits for every shard's done file (DLRover: 600 s)


class FlashCheckpoint(CheckpointStrategy):
    """Options: ``storage_every`` (a checkpoint step that is a multiple of it is also persisted to
    storage; default 4), ``save_at_breakpoint`` (the agent persists the shared memory when the workers
    fail, before they restart; default false, as DLRover's agent), ``copy_restored`` (copy the restored
    state out of the shared memory before training on it; default false, as DLRover returns it)."""

    node_agent = "resilience.strategies.dlrover.agent"
    options = ("storage_every", "save_at_breakpoint", "copy_restored")
    option_values: ClassVar[Mapping[str, Any]] = {"storage_every": int, "save_at_breakpoint": (True, False),
                                                  "copy_restored": (True, False)}
    layered_packages = PACKAGES
    capabilities = frozenset({Capability.MEMORY_COPY, Capability.RESTORE_TIERS})

    def __init__(self, context):
        super().__init__(context)
        self.checkpointer = None
        self.tier: str | None = None

    def _checkpointer(self):
        """DLRover's checkpointer, made on first use: the reference and the oracle's runs, which
        neither save nor restore, never meet the agent."""
        if self.checkpointer is None:
            placement = self.context.placement
            name = _node_name(self.context)
            os.environ.update(dlrover_environment(
                name, placement.node_ids.index(self.context.node), placement.nodes, self.context.local_rank,
                placement.ranks_per_node))
            use_node_sockets(name)
            from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer

            self.checkpointer = DdpCheckpointer(str(self.context.checkpoint_dir), save_timeout=SAVE_TIMEOUT_S)
        return self.checkpointer

    def during_memory_copy(self, callback) -> None:
        """DLRover copies tensor after tensor with ``_write_shared_memory`` (ckpt_saver.py:220-231),
        called by ``SharedMemoryHandler.save_state_dict`` once it published the step's metadata with
        ``writing_shm`` true (ckpt_saver.py:303-327): ``callback`` runs after each tensor's copy."""
        from dlrover.python.elastic_agent.torch import ckpt_saver

        copy = ckpt_saver._write_shared_memory

        def copy_then_call(value, meta, buffer):
            copy(value, meta, buffer)
            callback()

        ckpt_saver._write_shared_memory = copy_then_call

    def save(self, workload: Workload, step: int) -> None:
        from dlrover.trainer.torch.flash_checkpoint.ddp import StorageType

        every = self.context.options.get("storage_every", 4)
        kind = StorageType.DISK if step % every == 0 else StorageType.MEMORY
        self._checkpointer().save_checkpoint(step, {**workload.state_dict(), STEP_KEY: step}, storage_type=kind)

    def wait_persisted(self, step: int, timeout_s: float) -> bool:
        """A step persisted to storage (a multiple of ``storage_every``) is on disk once node 0's
        agent wrote the tracker naming it, after every node's shard (full_ckpt_engine.py:118-145,
        ckpt_saver.py ``commit_checkpoint``); a memory-only step never is."""
        if step % self.context.options.get("storage_every", 4):
            return False
        tracker = self.context.checkpoint_dir / TRACKER

        def named() -> bool:
            try:
                return int(tracker.read_text().strip() or 0) >= step
            except (FileNotFoundError, ValueError):
                return False

        return bool(wait_until(named, timeout_s, interval_s=0.05))

    def load(self, workload: Workload) -> None:
        engine = self._checkpointer()._engine
        from_memory = engine.get_state_dict_from_memory
        served: list[bool] = []

        def memory_then_note():  # engine.load asks the memory first (full_ckpt_engine.py:156)
            found = from_memory()
            served.append(bool(found[1]))
            return found

        engine.get_state_dict_from_memory = memory_then_note
        try:
            state = self.checkpointer.load_checkpoint()
        finally:
            del engine.get_state_dict_from_memory
        if not state:  # no checkpoint DLRover trusts: the script starts over, as DLRover's examples do
            return
        self.tier = "memory" if any(served) else "storage"
        state = dict(state)
        state.pop(STEP_KEY, None)
        if self.context.options.get("copy_restored", False):
            state = _copied(state)
        workload.load_state_dict(state)

    def restored_tier(self) -> str | None:
        return self.tier


def _node_name(context) -> str:
    if context.node_agent_root is None:
        raise RuntimeError("dlrover_flash needs its node agents: the harness starts them (not the torchrun driver)")
    return agent_name(agent_dir(context.node_agent_root, context.node))


def _copied(value: Any) -> Any:
    """``value`` with every tensor copied out of the shared memory it may view."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(item) for item in value)
    return value
