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

from ..workloads.base import TrainableWorkload, Workload
from .base import CheckpointStrategy, TrainingObserver


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
    (Accelerate's default sampler instead of its ``SeedableRandomSampler``, default true).
    """

    drives_training = True
    options = ("total_limit", "epoch_steps", "resume_iteration", "dataloader", "seedable_sampler")
    option_values: ClassVar[Mapping[str, Any]] = {"resume_iteration": (True, False), "total_limit": int,
                                                  "epoch_steps": int, "dataloader": RESUME_ROUTES,
                                                  "seedable_sampler": (True, False)}
    requires = {"accelerate": "pip install 'resilience[accelerate]'"}

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return (f"accelerate-{accelerate_version()}-{options.get('epoch_steps', 0)}-{options.get('dataloader', 'skip')}"
                f"-{options.get('seedable_sampler', True)}")

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        from .accelerate_engine import AccelerateTrainedWorkload

        return (cls, AccelerateTrainedWorkload)

    def prepare(self, workload: Workload) -> Workload:
        if not isinstance(workload, TrainableWorkload):
            raise TypeError(f"Accelerate trains a TrainableWorkload; {type(workload).__name__} is not one")
        from .accelerate_engine import AccelerateTrainedWorkload

        self.workload = AccelerateTrainedWorkload(workload)
        return self.workload

    def _accelerator(self, observer: TrainingObserver):
        from accelerate import Accelerator
        from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

        context = self.context
        for name, value in (("RANK", context.rank), ("LOCAL_RANK", context.local_rank),
                            ("WORLD_SIZE", context.world_size), ("LOCAL_WORLD_SIZE", context.world_size)):
            os.environ[name] = str(value)  # what Accelerate reads; the process group exists already
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # else Accelerate sets torch's thread count
        automatic = observer.start == "strategy" or observer.saves  # a snapshot names its own directory
        project = ProjectConfiguration(project_dir=str(context.checkpoint_dir), automatic_checkpoint_naming=automatic,
                                       total_limit=int(context.options.get("total_limit", 2)))
        return Accelerator(cpu=True, project_config=project, step_scheduler_with_optimizer=False,
                           dataloader_config=DataLoaderConfiguration(
                               use_seedable_sampler=context.options.get("seedable_sampler", True),
                               use_stateful_dataloader=context.options.get("dataloader") == "stateful"))

    def train(self, workload: Workload, observer: TrainingObserver) -> None:
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
