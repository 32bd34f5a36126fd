"""The Hugging Face Trainer as the system under test: a real ``transformers.Trainer`` (CPU, DDP over
the harness's gloo process group, which Accelerate picks up) trains a tiny causal language model
through ``Trainer.train`` and checkpoints with its own ``_save_checkpoint`` into
``<checkpoint dir>/checkpoint-N``; a restart calls ``Trainer.train(resume_from_checkpoint=True)``,
which resumes from the highest-numbered ``checkpoint-*`` folder. The harness never calls a step or
a save: it observes through a ``TrainerCallback``.

Transformers is an optional extra (``pip install 'resilience[transformers]'``); it is imported
only inside rank processes.
"""
from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any, ClassVar

from ...workloads.base import Workload
from ..accelerate.strategy import harness_environment
from ..base import CheckpointStrategy, TrainingObserver

WORKERS = (0, 1, 2)  # dataloader_num_workers


def transformers_version() -> str | None:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


class TrainerCheckpoint(CheckpointStrategy):
    """``Trainer.train`` with ``TrainingArguments(use_cpu=True, ddp_backend="gloo", save_strategy=
    "steps", save_steps=checkpoint_every, max_steps=steps, logging_steps=1, report_to=[])`` over a
    one-layer GPT-2 built from ``GPT2Config``; restart: ``Trainer.train(resume_from_checkpoint=True)``.
    The workload spec gives the steps, the save interval, the seed (model, data and
    ``TrainingArguments.seed``), the world size and the global batch
    (``per_device_train_batch_size = global_batch / (world_size * gradient_accumulation_steps)``).

    Options: ``save_total_limit: N`` (the Trainer's retention; default: keep every checkpoint),
    ``gradient_accumulation_steps: N`` (default 1), ``dataloader_num_workers: 0 | 1 | 2`` (default 0;
    with workers the collator runs in them and the data audit is off), ``seed: N``
    (``TrainingArguments.seed``, default the workload's), ``dropout: p`` (the model's dropout
    probabilities, default 0), ``epoch_steps: N`` (train on the first N global batches, so that an
    epoch ends every N steps; default: the whole set of 512 examples).
    """

    drives_training = True
    options = ("save_total_limit", "gradient_accumulation_steps", "dataloader_num_workers", "seed", "dropout",
               "epoch_steps")
    option_values: ClassVar[Mapping[str, Any]] = {"save_total_limit": int, "gradient_accumulation_steps": int,
                                                  "dataloader_num_workers": WORKERS, "epoch_steps": int}
    requires = {"transformers": "pip install 'resilience[transformers]'"}

    @staticmethod
    def check_options(options: Mapping[str, Any]) -> tuple[str, str, Any, Any] | None:
        seed = options.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            return ("strategy.options.seed", "must be an integer >= 0", seed, "0, 1, 2, ...")
        dropout = options.get("dropout", 0.0)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            return ("strategy.options.dropout", "must be a probability", dropout, "0 <= p < 1")
        return None

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        keys = ("gradient_accumulation_steps", "dataloader_num_workers", "seed", "dropout", "epoch_steps")
        return f"transformers-{transformers_version()}-" + "-".join(str(options.get(key, "")) for key in keys)

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        from . import engine as trainer_engine

        return (cls, trainer_engine.TrainerTrainedWorkload, trainer_engine.HarnessCallback,
                trainer_engine.CountingSequences, trainer_engine.IndexCollator)

    def prepare(self, workload: Workload) -> Workload:
        from .engine import TrainerTrainedWorkload, tiny_causal_lm

        spec, options = workload.spec, self.context.options
        accumulation = int(options.get("gradient_accumulation_steps", 1))
        if spec.global_batch % (self.context.world_size * accumulation):
            raise ValueError(f"global batch {spec.global_batch} is not divisible by world size "
                             f"{self.context.world_size} x gradient_accumulation_steps {accumulation}")
        model = tiny_causal_lm(spec.seed, float(options.get("dropout", 0.0)))
        self.workload = TrainerTrainedWorkload(spec, workload.rank, workload.world_size, model)
        return self.workload

    def train(self, workload: Workload, observer: TrainingObserver) -> None:
        from transformers import Trainer, TrainingArguments
        from transformers.trainer_callback import PrinterCallback
        from transformers.utils import logging as transformers_logging

        from .engine import EXAMPLES, CountingSequences, HarnessCallback, IndexCollator

        context, options, spec = self.context, self.context.options, self.workload.spec
        harness_environment(context)
        transformers_logging.disable_progress_bar()  # "Writing model shards" at every save
        accumulation = int(options.get("gradient_accumulation_steps", 1))
        examples = EXAMPLES
        if options.get("epoch_steps"):
            examples = min(EXAMPLES, int(options["epoch_steps"]) * spec.global_batch)
        arguments = TrainingArguments(
            output_dir=str(context.checkpoint_dir), use_cpu=True, ddp_backend="gloo", report_to=[],
            max_steps=observer.steps, save_strategy="steps" if observer.saves else "no",
            save_steps=observer.checkpoint_every, save_total_limit=options.get("save_total_limit"),
            logging_strategy="steps", logging_steps=1, disable_tqdm=True,
            per_device_train_batch_size=spec.global_batch // (context.world_size * accumulation),
            gradient_accumulation_steps=accumulation,
            dataloader_num_workers=int(options.get("dataloader_num_workers", 0)),
            seed=int(options.get("seed", spec.seed)), learning_rate=1e-2,
            remove_unused_columns=False)  # the items' indices reach the collator
        collator = IndexCollator()
        trainer = Trainer(model=self.workload.model, args=arguments, data_collator=collator,
                          train_dataset=CountingSequences(spec.seed, examples),
                          callbacks=[HarnessCallback(self.workload, observer, collator)])
        trainer.remove_callback(PrinterCallback)  # every step's log line on stdout otherwise
        self.workload.trainer = trainer
        resume: Any = {"fresh": None, "strategy": self._newest_or_none()}.get(observer.start)
        if observer.start == "snapshot":
            step = observer.snapshot_step
            resume = str(observer.snapshot_path(step) / f"checkpoint-{step}")
        trainer.train(resume_from_checkpoint=resume)

    def _newest_or_none(self) -> bool | None:
        """``True`` (the Trainer picks the highest-numbered ``checkpoint-*`` folder) where one exists;
        on a directory without one ``resume_from_checkpoint=True`` raises: nothing saved means a
        fresh start."""
        directory = self.context.checkpoint_dir
        if directory.is_dir() and any(path.is_dir() and path.name.startswith("checkpoint-")
                                      for path in directory.iterdir()):
            return True
        return None

    def save(self, workload: Workload, step: int) -> None:
        raise NotImplementedError("the Trainer saves inside Trainer.train")

    def load(self, workload: Workload) -> None:
        raise NotImplementedError("the Trainer restores inside Trainer.train(resume_from_checkpoint=True)")
