"""megatron-core's ``dist_checkpointing`` (``torch_dist`` backend) as Megatron-LM calls it, over the
model-parallel workload ``tp_mlp`` (the ``megatron`` extra; megatron-core 0.16.1).

Layout under the checkpoint directory::

    latest_checkpointed_iteration.txt     the tracker, rank 0, after the save returned everywhere
    iter_0000008/__<rank>_0.distcp        each rank's main-replica shards (a forked writer worker)
    iter_0000008/.metadata                the global index, rank 0 at finalize (temp file, rename)
    iter_0000008/common.pt                the common state (rank 0, torch.save)
    iter_0000008/metadata.json            backend and version, rank 0, last

The sequence follows Megatron-LM's ``megatron/training/checkpointing.py`` at the tag matching
the installed megatron-core (NVIDIA/Megatron-LM ``core_v0.16.1``, 55ac708): rank 0 creates
``iter_XXXXXXX/`` (``ensure_directory_exists``, 609), every rank calls ``dist_checkpointing.save`` with
the workload's ``sharded_state_dict`` (635); synchronous: a barrier (701), rank 0 writes the tracker
with a plain open and write (``iter_finalize_fn``, 716-724, called at 767), a barrier (798).
``async: true``: the save returns an ``AsyncRequest``, the tracker write is added to its finalize
functions (765) and the request is scheduled on an ``AsyncCallsQueue`` (792) built as megatron-core's
default, ``persistent=False`` (``megatron/training/async_utils.py:18``): a process forked per save. As
Megatron-LM's loop does, every training step first finalizes the saves already written without
blocking (``training.py:2694``), and training's end waits for the rest (``training.py:3012``).
Megatron-LM 0.16.1's argument check (``arguments.py:1138-1143``) turns ``--async-save`` off unless
``--use-persistent-ckpt-worker`` is given; that persistent worker is not offered here: it is
spawned, not forked, and its loop calls ``torch.cuda.set_device(rank % torch.cuda.device_count())``
(``dist_checkpointing/strategies/async_utils.py:488``), a ZeroDivisionError without CUDA, which
would need two more stubs (``device_count``, ``set_device``) in a process the rank's stubs do not reach.
Load (``load_checkpoint``, 1120-1130): the tracker (missing: start from random; not an integer:
``sys.exit()``, as ``read_metadata``), its maximum over ranks, ``dist_checkpointing.load`` of the
template ``sharded_state_dict`` with the ``strict`` handling (``--dist-ckpt-strictness``, default
``assume_ok_unexpected``), which reshards to this phase's tensor-, pipeline- and data-parallel sizes;
at another tensor- or pipeline-parallel size than the common state's ``args`` the template leaves
the RNG out (1542-1570, "RNG state will be ignored").

``fully_parallel: true`` wraps the save strategy in ``FullyParallelSaveStrategyWrapper`` over the
data-parallel group (each replica's shards spread over its data-parallel ranks) and the load in
``FullyParallelLoadStrategyWrapper`` with ``exchange_algo="gather_object"``. Megatron-LM uses its
default, ``broadcast`` (1125-1127), which, like ``gather_rounds``, allocates CUDA tensors for the
exchange (``exchange_utils.py:98-110, 326, 336, 499``: "Torch not compiled with CUDA enabled" on
this machine, measured): blocked on CPU, as no stub can give a CUDA tensor.

CPU: where CUDA is absent the rank stubs ``torch.cuda.synchronize`` and ``torch.cuda.current_device``
(``megatron_core_cpu.apply_cpu_stubs``; the call sites are listed there), nothing else.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

import torch.distributed as dist

from ...core.capabilities import Capability
from ...workloads.base import Workload
from ..base import CheckpointStrategy
from .core_cpu import apply_cpu_stubs
from .layout import iteration_dir, write_tracker
from .lm import agreed_iteration

# megatron-core's StrictHandling values that leave load's return value a state dict
STRICT_MODES = ("assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all", "ignore_all")
# what metadata.json's sharded_backend_version claims after the version_mismatch fault (it writes 1)
CLAIMED_VERSION = {"older": 0, "newer": 2}


class MegatronCoreCheckpoint(CheckpointStrategy):
    """``megatron.core.dist_checkpointing.save`` / ``load`` of a model-parallel workload's
    ``sharded_state_dict`` into ``iter_XXXXXXX/``, with Megatron-LM's tracker file."""

    options = ("async", "fully_parallel", "strict")
    option_values: ClassVar[dict[str, tuple[Any, ...]]] = {"async": (True, False), "fully_parallel": (True, False),
                                                          "strict": STRICT_MODES}
    requires = {"megatron": "pip install 'resilience[megatron]'"}
    capabilities = frozenset({Capability.VERSION_STAMP})
    # a load keeps nothing for the next (a reader per load; the cached results queue is the save's)
    warm_restores = True

    @classmethod
    def warm_process(cls, options: Mapping[str, Any]) -> None:
        """megatron-core's process-wide writer-results queue: a ``multiprocessing`` Manager (a
        spawned process, with its resource tracker) created at a process's first save and kept for
        its life (``filesystem_async.py:48-56``, ``_get_write_results_queue``, called at 185)."""
        from megatron.core.dist_checkpointing.strategies.filesystem_async import _get_write_results_queue

        _get_write_results_queue()

    def prepare(self, workload: Workload) -> Workload:
        if not workload.model_parallel:
            raise TypeError(f"strategy megatron_core needs a model-parallel workload such as tp_mlp, "
                            f"not {type(workload).__name__}")
        self.stubbed = apply_cpu_stubs()
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        self.data_group = workload.data_group
        self.queue = AsyncCallsQueue(persistent=False) if self.context.options.get("async") else None
        if self.queue is not None:
            train_step = workload.train_step

            def finalize_then_train() -> float:  # Megatron-LM: maybe_finalize_async_save(blocking=False)
                self.queue.maybe_finalize_async_calls(blocking=False)
                return train_step()

            workload.train_step = finalize_then_train
        return workload

    @property
    def fully_parallel(self) -> bool:
        return bool(self.context.options.get("fully_parallel", False))

    def _save_strategy(self):
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

        strategy = get_default_save_sharded_strategy()
        return FullyParallelSaveStrategyWrapper(strategy, self.data_group) if self.fully_parallel else strategy

    def save(self, workload: Workload, step: int) -> None:
        from megatron.core import dist_checkpointing

        directory = iteration_dir(self.context.checkpoint_dir, step)
        if self.context.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
        request = dist_checkpointing.save(workload.sharded_state_dict(), str(directory), self._save_strategy(),
                                          async_sharded_save=self.queue is not None)
        if self.queue is None:
            dist.barrier()
        if self.context.rank == 0:
            if self.queue is None:
                self._write_tracker(step)
            else:
                request.add_finalize_fn(lambda: self._write_tracker(step))
        if self.queue is not None:
            self.queue.schedule_async_request(request)
        else:
            dist.barrier()

    def _write_tracker(self, step: int) -> None:
        write_tracker(self.context.checkpoint_dir, step)

    def finish(self, workload: Workload) -> None:
        if self.queue is not None:
            self.queue.maybe_finalize_async_calls(blocking=True)

    def load(self, workload: Workload) -> None:
        from megatron.core import dist_checkpointing

        iteration = agreed_iteration(self.context.checkpoint_dir)
        if iteration is None:
            return
        directory = str(iteration_dir(self.context.checkpoint_dir, iteration))
        # Megatron-LM reads the common state first and leaves the RNG out at another TP or PP size
        with_rng = workload.checkpoint_sizes_match(dist_checkpointing.load_common_state_dict(directory))
        if not with_rng and self.context.rank == 0:
            print(f"(TP, PP) mismatch after resume ({workload.topology.tp}, {workload.topology.pp} "
                  "vs the checkpoint's): RNG state will be ignored", file=sys.stderr, flush=True)
        loaded = dist_checkpointing.load(workload.sharded_state_dict(loading=True, with_rng=with_rng), directory,
                                         self._load_strategy(directory),
                                         strict=self.context.options.get("strict", "assume_ok_unexpected"))
        workload.load_sharded(loaded)
        dist.barrier()

    def _load_strategy(self, directory: str):
        if not self.fully_parallel:
            return None
        from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
        from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

        return FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(directory), self.data_group,
                                                exchange_algo="gather_object")

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        """metadata.json (rank 0's) claims another ``sharded_backend_version``."""
        if self.context.rank != 0:
            return []
        path = iteration_dir(self.context.checkpoint_dir, step) / "metadata.json"
        config = json.loads(path.read_text())
        config["sharded_backend_version"] = CLAIMED_VERSION[claim]
        path.write_text(json.dumps(config))
        return [path.relative_to(self.context.checkpoint_dir).as_posix()]
