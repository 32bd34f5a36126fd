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

from ...workloads.base import TrainableWorkload, Workload
from ..base import CheckpointStrategy, TrainingObserver

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
    ``function: package.module:name`` (your own training function, unchanged, in place of the
    workload's loop: every rank calls it with ``arguments`` as keyword arguments and the checkpoint
    directory as ``directory_argument``, default ``project_dir``; `accelerate_user` observes it).
    """

    drives_training = True
    options = ("total_limit", "epoch_steps", "resume_iteration", "dataloader", "seedable_sampler", "function",
               "arguments", "directory_argument")
    option_values: ClassVar[Mapping[str, Any]] = {"resume_iteration": (True, False), "total_limit": int,
                                                  "epoch_steps": int, "dataloader": RESUME_ROUTES,
                                                  "seedable_sampler": (True, False)}
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
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return (f"accelerate-{accelerate_version()}-{options.get('epoch_steps', 0)}-{options.get('dataloader', 'skip')}"
                f"-{options.get('seedable_sampler', True)}-{options.get('function', 'workload')}"
                f"-{sorted(dict(options.get('arguments', {})).items())}")

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

    def _accelerator(self, observer: TrainingObserver):
        from accelerate import Accelerator
        from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

        context = self.context
        harness_environment(context)
        automatic = observer.start == "strategy" or observer.saves  # a snapshot names its own directory
        project = ProjectConfiguration(project_dir=str(context.checkpoint_dir), automatic_checkpoint_naming=automatic,
                                       total_limit=int(context.options.get("total_limit", 2)))
        return Accelerator(cpu=True, project_config=project, step_scheduler_with_optimizer=False,
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
        accelerator = self.workload.accelerator = self._accelerator(observer)
        spec = inner.spec
        inputs, targets = inner.training_examples()
        epoch_steps = int(self.context.options.get("epoch_steps", 0) or len(inputs) // spec.global_batch)
        examples = min(len(inputs), epoch_steps * spec.global_batch)
        # each item carries its index: the data audit reads which samples a batch held from the batch
        dataset = torch.utils.data.TensorDataset(torch.arange(examples), inputs[:examples], targets[:examples])
        loader = torch.utils.data.DataLoader(dataset, batch_size=spec.global_batch // self.context.world_size,
                                             shuffle=True, drop_last=True)
        model, optimizer, loader, scheduler = accelerator.prepare(inner.model, inner.optimizer, loader, inner.scheduler)
        accelerator.register_for_checkpointing(position)
        if observer.start == "strategy":
            self._load_newest(accelerator)
        elif observer.start == "snapshot":
            accelerator.load_state(str(observer.snapshot_path(observer.snapshot_step)))
        observer.restored(self.workload)
        while position.step < observer.steps:
            loader.set_epoch(position.epoch)
            skip = position.batch and self.context.options.get("dataloader", "skip") == "skip"
            batches = accelerator.skip_first_batches(loader, position.batch) if skip else loader
            for batch_samples, batch_inputs, batch_targets in batches:
                step = position.step + 1
                inner.last_samples = batch_samples.tolist()
                observer.before_step(step)
                loss = inner.local_loss(model(batch_inputs), batch_targets)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                position.step, position.batch = step, position.batch + 1
                inner.count_step()
                total = accelerator.reduce(loss.detach().clone().reshape(1), reduction="sum")
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
