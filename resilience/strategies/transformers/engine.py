"""The Hugging Face Trainer as it trains: the tiny causal language model built from a config (no
download), the synthetic token data set whose items carry their index, the collator that reads
those indices off each batch, the ``TrainerCallback`` through which the harness observes
``Trainer.train``, and the workload whose steps the Trainer computes. What decides the numbers of
a Trainer-trained run lives here and in ``strategy.py``: the reference cache is keyed on both.

Imported only inside rank processes (the strategy's ``prepare``, or the fork server's preload).
"""
from __future__ import annotations

from collections import deque
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback

from ...workloads.base import Workload
from ..base import TrainingObserver

VOCABULARY = 32  # tokens
SEQUENCE = 8  # tokens per example
WIDTH = 8  # embedding width: about 1,200 parameters with one layer of two heads
EXAMPLES = 512  # the data set, as the mlp workload's


def tiny_causal_lm(seed: int, dropout: float) -> GPT2LMHeadModel:
    """A one-layer GPT-2 from its config, initialised from ``seed`` (every rank the same bits)."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCABULARY, n_positions=SEQUENCE, n_embd=WIDTH, n_layer=1, n_head=2,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                        bos_token_id=VOCABULARY - 1, eos_token_id=VOCABULARY - 1)
    return GPT2LMHeadModel(config)


class CountingSequences(torch.utils.data.Dataset):
    """``examples`` sequences that count by a stride modulo the vocabulary (something to learn),
    each start and stride drawn from ``seed``; an item is ``{"index", "input_ids", "labels"}``.
    A ``held_out`` set (what ``eval_steps`` evaluates) is drawn apart, its indices negative so that
    the collator tells its batches from the training set's."""

    def __init__(self, seed: int, examples: int, held_out: bool = False):
        self.first_index = -examples if held_out else 0
        generator = torch.Generator().manual_seed(seed + (2 if held_out else 1))
        starts = torch.randint(0, VOCABULARY, (examples, 1), generator=generator)
        strides = torch.randint(1, 4, (examples, 1), generator=generator)
        self.tokens = (starts + strides * torch.arange(SEQUENCE)) % VOCABULARY

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": self.first_index + index, "input_ids": self.tokens[index], "labels": self.tokens[index]}


class IndexCollator:
    """Stacks a batch's tokens for the model and keeps its items' indices, in the order the loader
    collates them, for the data audit: Accelerate's loader collates one batch ahead, so the
    callback takes a step's batches from the front. Where workers collate (``num_workers > 0``)
    the indices stay in the workers: the audit is off (``take`` answers None). Batches of the
    held-out set (negative indices) are not training batches: not kept."""

    def __init__(self) -> None:
        self.pending: deque[list[int]] = deque()

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        indices = [int(item["index"]) for item in items]
        if indices[0] >= 0:
            self.pending.append(indices)
        return {"input_ids": torch.stack([item["input_ids"] for item in items]),
                "labels": torch.stack([item["labels"] for item in items])}

    def take(self, batches: int) -> list[int] | None:
        if len(self.pending) < batches:
            return None
        return [index for _ in range(batches) for index in self.pending.popleft()]


class TrainerTrainedWorkload(Workload):
    """The workload whose steps ``Trainer.train`` computes. Its state (what fingerprints see): the
    Trainer's global step, the model's parameters and buffers, the optimizer's and the LR
    scheduler's state; the data position lives in the Trainer's loop and shows in the losses and
    the data audit after a restore."""

    def __init__(self, spec: Any, rank: int, world_size: int, model: torch.nn.Module):
        super().__init__(spec, rank, world_size)
        self.model = model
        self.trainer: Any = None

    @property
    def step(self) -> int:
        return self.trainer.state.global_step if self.trainer is not None else 0

    def train_step(self) -> float:
        raise NotImplementedError("Trainer.train computes the steps of a Trainer-trained workload")

    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        return {"step": self.step, "model": self.model.state_dict(),
                "optimizer": trainer.optimizer.state_dict() if trainer.optimizer is not None else {},
                "scheduler": trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError("the Trainer restores its own checkpoints (resume_from_checkpoint)")

    def save_reference_snapshot(self, directory) -> None:
        """The reference run's own state as the Trainer checkpoints it (``_save_checkpoint``, its one
        save: model, optimizer, scheduler, RNG states, trainer state) into ``directory/checkpoint-N``;
        collective as the Trainer's save is. The continuation resumes from that folder."""
        trainer = self.trainer
        output_dir, only_model = trainer.args.output_dir, trainer.args.save_only_model
        trainer.args.output_dir, trainer.args.save_only_model = str(directory), False  # all of the state
        try:
            trainer._save_checkpoint(trainer.model, trial=None)
        finally:
            trainer.args.output_dir, trainer.args.save_only_model = output_dir, only_model


class HarnessCallback(TrainerCallback):
    """The harness's eyes in ``Trainer.train``. The Trainer calls, per optimizer step:
    ``on_step_begin`` (first micro-batch), ``on_substep_end`` after each micro-batch but the last
    (``gradient_accumulation_steps`` >= 2; trainer.py:1969), ``on_step_end``, then in ``_maybe_log_save_evaluate``
    ``on_log`` (``logging_steps=1``: the loss gathered from every rank and averaged, identical on
    all of them) and, when it saves, ``_save_checkpoint`` and ``on_save``."""

    def __init__(self, workload: TrainerTrainedWorkload, observer: TrainingObserver, collator: IndexCollator):
        self.workload, self.observer, self.collator = workload, observer, collator

    def on_train_begin(self, args, state, control, **kwargs):
        self.observer.restored(self.workload)  # model, optimizer, scheduler and state are loaded by now

    def on_step_begin(self, args, state, control, **kwargs):
        self.observer.before_step(state.global_step + 1)

    def on_substep_end(self, args, state, control, **kwargs):  # a micro-batch accumulated, not the step's last
        self.observer.between_micro_steps(state.global_step + 1)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:  # the end-of-training summary, say
            return
        step = state.global_step
        self.workload.last_samples = self.collator.take(self.workload.trainer.current_gradient_accumulation_steps)
        self.observer.after_step(self.workload, step, float(logs["loss"]))
        if self.observer.snapshot_due(step):
            self.workload.save_reference_snapshot(self.observer.snapshot_path(step))
        if self.observer.saves and control.should_save:  # the Trainer saves right after this hook
            self.observer.before_save(step)

    def on_save(self, args, state, control, **kwargs):
        if self.observer.saves:
            self.observer.after_save(state.global_step)
