"""Hugging Face Accelerate as the system under test: a real ``accelerate.Accelerator`` (CPU, the
harness's gloo process group, which it picks up) prepares the workload's model, optimizer, LR
schedule and a ``DataLoader``, and the training loop its documentation shows trains them;
``save_state()`` with ``ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=N)``
checkpoints, ``load_state()`` restores the newest ``checkpoints/checkpoint_<i>``, and the
data loader resumes with ``skip_first_batches`` from a position registered for checkpointing.

Accelerate is an optional extra (``pip install 'resilience[accelerate]'``); it is imported only
inside rank processes.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from importlib import metadata
from typing import Any, ClassVar

from ...core.plan import Start
from ...workloads.base import TrainableWorkload, Workload
from ..base import CheckpointStrategy, TrainingObserver

#: the workload options Accelerate trains with: the model-level ones travel in the workload's model,
#: ``accumulation`` is ``Accelerator(gradient_accumulation_steps=...)`` with ``accumulate(model)``,
#: and ``ema`` the workload's average, registered with ``register_for_checkpointing``
WORKLOAD_OPTIONS = frozenset({"dropout", "buffers", "tied", "accumulation", "ema"})
RESUME_ROUTES = ("skip", "stateful")  # skip_first_batches, or DataLoaderConfiguration(use_stateful_dataloader=True)


def accelerate_version() -> str | None:
    try:
        return metadata.version("accelerate")
    except metadata.PackageNotFoundError:
        return None


class AccelerateCheckpoint(CheckpointStrategy):
    """The Accelerate loop with ``save_state()`` every ``checkpoint_every`` steps and ``load_state()``
    at restart (automatic checkpoint naming; none saved yet: start from scratch).

    Options: ``total_limit: N`` (ProjectConfiguration's retention, default 2), ``epoch_steps: N``
    (an epoch is the first N global batches), ``resume_iteration: true`` (after ``load_state`` set
    ``project_configuration.iteration`` past the loaded folder, which ``load_state`` does not do:
    without it the next ``save_state`` finds ``checkpoint_0`` taken), ``dataloader: skip | stateful``
    (resume the epoch with ``skip_first_batches``, default, or let Accelerate's stateful data loader,
    ``use_stateful_dataloader=True``, save and restore its own position), ``seedable_sampler: false``
    (Accelerate's default sampler instead of its ``SeedableRandomSampler``, default true),
    ``loader_generator: true`` (give the ``DataLoader`` a ``torch.Generator`` of its own, so that
    the iterator made at a resume draws nothing from the stream dropout draws from; default false,
    as Accelerate's examples build it),
    ``function: package.module:name`` (your own training function, unchanged, in place of the
    workload's loop: every rank calls it with ``arguments`` as keyword arguments and the checkpoint
    directory as ``directory_argument``, default ``project_dir``; `accelerate_user` observes it).
    """

    drives_training = True
    options = ("total_limit", "epoch_steps", "resume_iteration", "dataloader", "seedable_sampler", "function",
               "arguments", "directory_argument", "loader_generator")
    option_values: ClassVar[Mapping[str, Any]] = {"resume_iteration": (True, False), "total_limit": int,
                                                  "epoch_steps": int, "dataloader": RESUME_ROUTES,
                                                  "seedable_sampler": (True, False),
                                                  "loader_generator": (True, False)}
    requires = {"accelerate": "pip install 'resilience[accelerate]'"}

    @staticmethod
    def check_options(options: Mapping[str, Any]) -> tuple[str, str, Any, Any] | None:
        name = options.get("function")
        if name is not None and (not isinstance(name, str) or name.count(":") != 1 or name.startswith(":")
                                 or name.endswith(":")):
            return ("strategy.options.function", "must name a function", name, "package.module:name")
        arguments = options.get("arguments", {})
        if not isinstance(arguments, Mapping) or not all(isinstance(key, str) for key in arguments):
            return ("strategy.options.arguments", "must map argument names to values", arguments,
                    "a mapping such as {steps: 12}")
        if not isinstance(options.get("directory_argument", "project_dir"), str):
            return ("strategy.options.directory_argument", "must be an argument name",
                    options["directory_argument"], "a name such as project_dir")
        return None

    @classmethod
    def workload_options(cls, options: Mapping[str, Any]) -> frozenset[str] | None:
        """`WORKLOAD_OPTIONS` in the workload's loop; none in a user's own function."""
        return frozenset() if options.get("function") else WORKLOAD_OPTIONS

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return (f"accelerate-{accelerate_version()}-{options.get('epoch_steps', 0)}-{options.get('dataloader', 'skip')}"
                f"-{options.get('seedable_sampler', True)}-{options.get('function', 'workload')}"
                f"-{sorted(dict(options.get('arguments', {})).items())}-{options.get('loader_generator', False)}")

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        from .engine import AccelerateTrainedWorkload

        if options.get("function"):
            from . import user as accelerate_user

            return (cls, accelerate_user.Observed, accelerate_user.user_function(options["function"]))
        return (cls, AccelerateTrainedWorkload)

    def prepare(self, workload: Workload) -> Workload:
        if self.context.options.get("function"):
            from .user import UserFunctionWorkload

            harness_environment(self.context)
            self.workload = UserFunctionWorkload(workload.spec, workload.rank, workload.world_size)
            return self.workload
        if not isinstance(workload, TrainableWorkload):
            raise TypeError(f"Accelerate trains a TrainableWorkload; {type(workload).__name__} is not one")
        from .engine import AccelerateTrainedWorkload

        self.workload = AccelerateTrainedWorkload(workload)
        return self.workload

    def _accelerator(self, observer: TrainingObserver, accumulation: int):
        from accelerate import Accelerator
        from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

        context = self.context
        harness_environment(context)
        automatic = observer.start == Start.STRATEGY or observer.saves  # a snapshot names its own directory
        project = ProjectConfiguration(project_dir=str(context.checkpoint_dir), automatic_checkpoint_naming=automatic,
                                       total_limit=int(context.options.get("total_limit", 2)))
        return Accelerator(cpu=True, project_config=project, step_scheduler_with_optimizer=False,
                           gradient_accumulation_steps=accumulation,
                           dataloader_config=DataLoaderConfiguration(
                               use_seedable_sampler=context.options.get("seedable_sampler", True),
                               use_stateful_dataloader=context.options.get("dataloader") == "stateful"))

    def train(self, workload: Workload, observer: TrainingObserver) -> None:
        if self.context.options.get("function"):
            from .user import train_user_function

            options = self.context.options
            return train_user_function(options["function"], dict(options.get("arguments", {})),
                                       options.get("directory_argument", "project_dir"),
                                       str(self.context.checkpoint_dir), self.workload, observer)
        import torch

        inner, position = self.workload.inner, self.workload.position
        spec = inner.spec
        accumulation = int(spec.options.get("accumulation", 1))
        accelerator = self.workload.accelerator = self._accelerator(observer, accumulation)
        inputs, targets = inner.training_examples()
        epoch_steps = int(self.context.options.get("epoch_steps", 0) or len(inputs) // spec.global_batch)
        examples = min(len(inputs), epoch_steps * spec.global_batch)
        # each item carries its index: the data audit reads which samples a batch held from the batch
        dataset = torch.utils.data.TensorDataset(torch.arange(examples), inputs[:examples], targets[:examples])
        # without a generator of its own, each iterator the loader makes draws its base seed from
        # the process's default generator, the one dropout draws from
        generator = torch.Generator().manual_seed(spec.seed) if self.context.options.get("loader_generator") else None
        loader = torch.utils.data.DataLoader(dataset, batch_size=spec.global_batch // self.context.world_size
                                             // accumulation, shuffle=True, drop_last=True, generator=generator)
        model, optimizer, loader, scheduler = accelerator.prepare(inner.model, inner.optimizer, loader, inner.scheduler)
        accelerator.register_for_checkpointing(position)
        average = getattr(inner, "average", None)
        if average is not None:  # the weights' average, checkpointed as a script registers it
            accelerator.register_for_checkpointing(average)
        if observer.start == Start.STRATEGY:
            self._load_newest(accelerator)
        elif observer.start == Start.SNAPSHOT:
            accelerator.load_state(str(observer.snapshot_path(observer.snapshot_step)))
        observer.restored(self.workload)
        samples: list[int] = []
        while position.step < observer.steps:
            loader.set_epoch(position.epoch)
            skip = position.batch and self.context.options.get("dataloader", "skip") == "skip"
            batches = accelerator.skip_first_batches(loader, position.batch) if skip else loader
            for batch_samples, batch_inputs, batch_targets in batches:
                step = position.step + 1
                if samples:  # a later micro-batch of the step the first one began
                    observer.between_micro_steps(step)
                else:
                    observer.before_step(step)
                    total = torch.zeros(1)
                samples += batch_samples.tolist()
                with accelerator.accumulate(model):  # the optimizer and schedule step on the last micro-batch
                    loss = inner.local_loss(model(batch_inputs), batch_targets)
                    accelerator.backward(loss)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                position.batch += 1
                total += loss.detach() / accumulation
                if not accelerator.sync_gradients:
                    continue
                inner.last_samples, samples = samples, []
                position.step = step
                inner.count_step()
                total = accelerator.reduce(total, reduction="sum")
                observer.after_step(self.workload, step, float(total[0]) / self.context.world_size)
                if observer.snapshot_due(step):
                    self.workload.save_reference_snapshot(observer.snapshot_path(step))
                if observer.saves and step % observer.checkpoint_every == 0:
                    observer.before_save(step)
                    accelerator.save_state()
                    observer.after_save(step)
                if position.step >= observer.steps:
                    break
            else:
                position.epoch, position.batch = position.epoch + 1, 0

    def _load_newest(self, accelerator) -> None:
        """``load_state()`` when a checkpoint folder exists (on an empty directory Accelerate
        raises from ``os.listdir`` or ``folders[-1]``: nothing saved means a fresh start)."""
        folder = self.context.checkpoint_dir / "checkpoints"
        if not folder.is_dir() or not any(folder.iterdir()):
            return
        accelerator.load_state()
        if self.context.options.get("resume_iteration"):
            newest = max(int(re.findall(r"([0-9]+)$", path.name)[0]) for path in folder.iterdir())
            accelerator.project_configuration.iteration = newest + 1

    def save(self, workload: Workload, step: int) -> None:
        raise NotImplementedError("the Accelerate loop saves with Accelerator.save_state")

    def load(self, workload: Workload) -> None:
        raise NotImplementedError("the Accelerate loop restores with Accelerator.load_state")


def harness_environment(context) -> None:
    """What Accelerate reads to join the harness's ranks; the process group exists already."""
    for name, value in (("RANK", context.rank), ("LOCAL_RANK", context.local_rank),
                        ("WORLD_SIZE", context.world_size), ("LOCAL_WORLD_SIZE", context.world_size)):
        os.environ[name] = str(value)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # else Accelerate sets torch's thread count
