"""The torchtitan trainer's loop, trimmed to what a checkpoint touches and called in the trainer's
order (torchtitan 0.3.0, ``torchtitan/trainer.py``; the line numbers are that file's):

    checkpointer.load(step=load_step)                       1018, before the loop
    while step < steps:                                     1031
        step += 1                                           1032
        train_step:  optimizers.zero_grad()                 874
                     forward, loss / global tokens, backward
                     clip_grad_norm_                        939-946
                     checkpointer.maybe_wait_for_staging()  947
                     optimizers.step()                      948
                     lr_schedulers.step()                   949
        checkpointer.save(step, last_step=step == steps)    1044-1047
    checkpointer.close()                                    1085-1089 (Trainer.close, train.py:65-71)

What it leaves out draws nothing and saves nothing: metrics, the profiler, garbage collection,
validation, the fault-tolerance manager. The harness's observer is called between these lines.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.loss import cross_entropy_loss
from torchtitan.distributed import utils as dist_utils

from ...core.plan import Start
from ..base import TrainingObserver
from .engine import MASK_TOKEN, TitanTrainedWorkload


def train(workload: TitanTrainedWorkload, observer: TrainingObserver, checkpoint_dir: str,
          options: dict[str, Any]) -> None:
    """One phase: restore as ``observer.start`` says, train to ``observer.steps``, saving as the
    manager decides where the phase saves."""
    base, load_step = checkpoint_dir, -1
    if observer.start == Start.SNAPSHOT:  # the oracle's continuation: the reference's own torchtitan checkpoint
        base, load_step = str(observer.snapshot_path(observer.snapshot_step)), observer.snapshot_step
    elif observer.start == Start.STEP:  # the availability probe: the one checkpoint it names
        load_step = observer.snapshot_step
    manager = workload.manager(
        base, enable=observer.saves or observer.start != Start.FRESH, interval=observer.checkpoint_every,
        async_mode=options.get("async_mode", "disabled"), keep_latest_k=options.get("keep_latest_k", 0),
        last_save_model_only=options.get("last_save_model_only", True),
        last_save_in_hf=options.get("last_save_in_hf", False),
        export_dtype=options.get("export_dtype", "float32"))
    try:
        manager.load(step=load_step)
        observer.restored(workload)
        batches = iter(workload.dataloader)
        state = workload.train_state
        while state.step < observer.steps:
            state.step += 1
            step = state.step
            observer.before_step(step)
            loss = train_step(workload, manager, batches)
            observer.after_step(workload, step, loss)
            if observer.snapshot_due(step):
                workload.save_reference_snapshot(observer.snapshot_path(step))
            if observer.saves:
                at_checkpoint = step % observer.checkpoint_every == 0
                if at_checkpoint:
                    observer.before_save(step)
                if manager.save(step, last_step=step == observer.steps) and at_checkpoint:
                    observer.after_save(step)
    finally:
        manager.close()


def train_step(workload: TitanTrainedWorkload, manager: Any, batches: Any) -> float:
    """``Trainer.train_step`` for one micro-batch (``trainer.py:871-949``); the global loss,
    identical on every rank."""
    optimizers = workload.optimizers
    optimizers.zero_grad()
    inputs, labels = next(batches)
    tokens = inputs["input"]
    workload.last_samples = [int(index) for index in inputs["index"]]
    if workload.token_masking:  # drawn from the process's generator, which torchtitan does not checkpoint
        tokens = tokens.masked_fill(torch.rand(tokens.shape) < workload.token_masking, MASK_TOKEN)
    local_tokens = torch.tensor(labels.numel(), dtype=torch.int64)
    global_tokens = dist_utils.dist_sum_tensor(local_tokens, workload.parallel_dims.get_mesh("batch"))
    loss = cross_entropy_loss(workload.model(tokens), labels) / global_tokens
    loss.backward()
    dist_utils.clip_grad_norm_([p for p in workload.model.parameters()], workload.training.max_norm, foreach=True)
    manager.maybe_wait_for_staging()
    optimizers.step()
    workload.lr_schedulers.step()
    workload.train_state.ntokens_seen += labels.numel()
    reported = loss.detach().clone()
    dist.all_reduce(reported)
    return float(reported.item())
