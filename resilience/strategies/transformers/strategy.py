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
from pathlib import Path
from typing import Any, ClassVar

from ...core.capabilities import Capability
from ...core.plan import Start
from ...workloads.base import Workload
from ..accelerate.strategy import harness_environment
from ..base import CheckpointStrategy, TrainingObserver
from . import arguments

WORKERS = (0, 1, 2)  # dataloader_num_workers


def transformers_version() -> str | None:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


class TrainerCheckpoint(CheckpointStrategy):
    """``Trainer.train`` with ``TrainingArguments(use_cpu=True, ddp_backend="gloo", save_strategy=
    "steps", save_steps=checkpoint_every, max_steps=steps, logging_steps=1, report_to=[])`` over a
    one-layer GPT-2 built from ``GPT2Config``; restart: ``Trainer.train(resume_from_checkpoint=True)``;
    the availability probe: ``resume_from_checkpoint=<checkpoint dir>/checkpoint-N``.
    The workload spec gives the steps, the save interval, the seed (model, data and
    ``TrainingArguments.seed``), the world size and the global batch
    (``per_device_train_batch_size = global_batch / (world_size * gradient_accumulation_steps)``).

    Options, ``TrainingArguments`` of the same name: ``save_total_limit``,
    ``gradient_accumulation_steps`` (default 1), ``dataloader_num_workers: 0 | 1 | 2`` (default 0;
    with workers the collator runs in them and the data audit is off), ``seed`` (default the
    workload's), ``data_seed``, ``ignore_data_skip``, ``save_only_model``, ``eval_steps`` (a held-out
    set of 32 sequences, evaluated every N steps), ``load_best_model_at_end`` (with ``eval_steps``).
    Others: ``dropout: p`` (the built-in model's dropout probabilities, default 0), ``epoch_steps: N``
    (train on the first N global batches, so that an epoch ends every N steps; default: the whole
    set of 512 examples), ``model: package.module:Class`` and ``model_config: {...}`` (your own
    ``PreTrainedModel`` class, built from ``Class.config_class(**model_config)``), and
    ``training_arguments: {...}`` (any other ``TrainingArguments`` field; see ``arguments``),
    ``earlier_run: N`` (before the first run, an earlier run of the job, its model drawn from the
    next seed, trained N steps into the same output directory: a reused ``output_dir``).
    """

    drives_training = True
    options = ("save_total_limit", "gradient_accumulation_steps", "dataloader_num_workers", "seed", "data_seed",
               "ignore_data_skip", "save_only_model", "eval_steps", "load_best_model_at_end", "dropout",
               "epoch_steps", "model", "model_config", "training_arguments", "earlier_run")
    option_values: ClassVar[Mapping[str, Any]] = {
        "save_total_limit": int, "gradient_accumulation_steps": int, "dataloader_num_workers": WORKERS,
        "epoch_steps": int, "eval_steps": int, "earlier_run": int, **{flag: (True, False) for flag in arguments.FLAGS}}
    requires = {"transformers": "pip install 'resilience[transformers]'"}
    capabilities = frozenset({Capability.CHOSEN_STEP})

    @staticmethod
    def check_options(options: Mapping[str, Any]) -> tuple[str, str, Any, Any] | None:
        return arguments.option_problem(options)

    @classmethod
    def micro_steps(cls, options: Mapping[str, Any]) -> int:
        return int(options.get("gradient_accumulation_steps", 1))

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return f"transformers-{transformers_version()}-{arguments.fingerprint(options)}"

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        from . import engine as trainer_engine

        user_model = (arguments.model_class_named(options["model"]),) if options.get("model") else ()
        return (cls, trainer_engine.TrainerTrainedWorkload, trainer_engine.HarnessCallback,
                trainer_engine.CountingSequences, trainer_engine.IndexCollator, *user_model)

    def prepare(self, workload: Workload) -> Workload:
        from .engine import TrainerTrainedWorkload, tiny_causal_lm

        spec, options = workload.spec, self.context.options
        accumulation = int(options.get("gradient_accumulation_steps", 1))
        if spec.global_batch % (self.context.world_size * accumulation):
            raise ValueError(f"global batch {spec.global_batch} is not divisible by world size "
                             f"{self.context.world_size} x gradient_accumulation_steps {accumulation}")
        model = arguments.causal_lm(options, spec.seed, lambda dropout: tiny_causal_lm(spec.seed, dropout))
        self.workload = TrainerTrainedWorkload(spec, workload.rank, workload.world_size, model)
        return self.workload

    def train(self, workload: Workload, observer: TrainingObserver) -> None:
        from transformers import Trainer
        from transformers.trainer_callback import PrinterCallback
        from transformers.utils import logging as transformers_logging

        from .engine import EXAMPLES, CountingSequences, HarnessCallback, IndexCollator

        context, options, spec = self.context, self.context.options, self.workload.spec
        harness_environment(context)
        transformers_logging.disable_progress_bar()  # "Writing model shards" at every save
        examples = EXAMPLES
        if options.get("epoch_steps"):
            examples = min(EXAMPLES, int(options["epoch_steps"]) * spec.global_batch)
        training = arguments.training_arguments(
            options, str(context.checkpoint_dir), context.world_size, spec.global_batch, spec.seed, observer.steps,
            observer.checkpoint_every if observer.saves else None)
        data = CountingSequences(spec.seed, examples)
        held_out = CountingSequences(spec.seed, arguments.EVAL_EXAMPLES, held_out=True) \
            if options.get("eval_steps") else None
        if observer.start == Start.FRESH and observer.saves and options.get("earlier_run"):
            self._earlier_run(int(options["earlier_run"]), observer, data, held_out)  # before the job's Trainer seeds
        collator = IndexCollator()
        trainer = Trainer(model=self.workload.model, args=training, data_collator=collator,
                          train_dataset=data, eval_dataset=held_out,
                          callbacks=[HarnessCallback(self.workload, observer, collator)])
        trainer.remove_callback(PrinterCallback)  # every step's log line on stdout otherwise
        self.workload.trainer = trainer
        trainer.train(resume_from_checkpoint=self._resume_from(observer))

    def _earlier_run(self, steps: int, observer: TrainingObserver, data: Any, held_out: Any) -> None:
        """An earlier run of the same job (the model drawn from another seed) that trained ``steps``
        steps into the same output directory, saving as the job does: the checkpoints a reused
        ``output_dir`` holds when the first run starts. Run before it, unobserved."""
        from transformers import Trainer
        from transformers.trainer_callback import PrinterCallback

        from .engine import IndexCollator, tiny_causal_lm

        context, options, spec = self.context, self.context.options, self.workload.spec
        seed = spec.seed + 1
        training = arguments.training_arguments(options, str(context.checkpoint_dir), context.world_size,
                                                spec.global_batch, seed, steps, observer.checkpoint_every)
        model = arguments.causal_lm(options, seed, lambda dropout: tiny_causal_lm(seed, dropout))
        earlier = Trainer(model=model, args=training, data_collator=IndexCollator(), train_dataset=data,
                          eval_dataset=held_out)
        earlier.remove_callback(PrinterCallback)
        earlier.train()

    def _resume_from(self, observer: TrainingObserver) -> str | bool | None:
        """``resume_from_checkpoint`` for the phase: nothing (a fresh start), ``True`` (the restart:
        the Trainer picks the highest-numbered ``checkpoint-*`` folder), or a folder (the trusted
        snapshot, or the one checkpoint the availability probe restores)."""
        if observer.start == Start.SNAPSHOT:
            step = observer.snapshot_step
            return str(observer.snapshot_path(step) / f"checkpoint-{step}")
        if observer.start == Start.STEP:
            return str(self.step_location(observer.snapshot_step))
        if observer.start == Start.STRATEGY:
            return self._newest_or_none()
        return None

    def _newest_or_none(self) -> bool | None:
        """``True`` where a ``checkpoint-*`` folder exists; on a directory without one
        ``resume_from_checkpoint=True`` raises: nothing saved means a fresh start."""
        directory = self.context.checkpoint_dir
        if directory.is_dir() and any(path.is_dir() and path.name.startswith("checkpoint-")
                                      for path in directory.iterdir()):
            return True
        return None

    def step_location(self, step: int) -> Path | None:
        return Path(self.context.checkpoint_dir) / f"checkpoint-{step}"

    def save(self, workload: Workload, step: int) -> None:
        raise NotImplementedError("the Trainer saves inside Trainer.train")

    def load(self, workload: Workload) -> None:
        raise NotImplementedError("the Trainer restores inside Trainer.train(resume_from_checkpoint=True)")

    def load_step(self, workload: Workload, step: int) -> None:
        raise NotImplementedError("the Trainer restores a chosen checkpoint inside "
                                  "Trainer.train(resume_from_checkpoint=<checkpoint-N>)")
