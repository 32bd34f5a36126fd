"""PyTorch Lightning as the system under test: a real ``Trainer`` (CPU, DDP over gloo, the
harness's ranks as its processes) trains the workload through ``Trainer.fit`` and checkpoints with
its own ``ModelCheckpoint``; a restart calls ``Trainer.fit(..., ckpt_path="last")``. The harness
never calls ``training_step`` or ``save_checkpoint``: it observes through a ``Callback``.

Lightning is an optional extra (``pip install 'resilience[lightning]'``); it is imported only
inside rank processes.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import metadata
from typing import Any, ClassVar

from ...core.plan import Start
from ...workloads.base import TrainableWorkload, Workload
from ..base import CheckpointStrategy, TrainingObserver

#: the workload options Lightning trains with: the model-level ones travel in the workload's model,
#: ``accumulation`` is ``Trainer(accumulate_grad_batches=...)``, ``ema`` Lightning's own
#: ``EMAWeightAveraging`` callback
WORKLOAD_OPTIONS = frozenset({"dropout", "buffers", "tied", "accumulation", "ema"})
LOADERS = ("plain", "stateful", "stateful_distributed")  # torch's DataLoader; torchdata's StatefulDataLoader
TOP_K = (-1, 0, 1)  # ModelCheckpoint without a monitor accepts these


def lightning_version() -> str | None:
    try:
        return metadata.version("pytorch-lightning")
    except metadata.PackageNotFoundError:
        return None


class LightningCheckpoint(CheckpointStrategy):
    """``Trainer.fit`` with ``ModelCheckpoint(dirpath=<checkpoint dir>, every_n_train_steps=
    checkpoint_every, save_last=True, save_top_k=...)``; restart: ``Trainer.fit(ckpt_path="last")``.

    Options: ``dataloader: plain | stateful | stateful_distributed`` (torch's ``DataLoader(shuffle=
    True)``, default; torchdata's ``StatefulDataLoader(shuffle=True)``, whose position Lightning saves
    and restores; the same given torch's ``RandomSampler``, which Lightning replaces by a
    ``DistributedSampler``), ``save_top_k: -1 | 0 | 1``
    (default 1), ``epoch_steps: N`` (train on the first N global batches of the data set, so that an
    epoch ends every N steps; default: the whole set), ``on_exception: true`` (add Lightning's
    ``OnExceptionCheckpoint`` into the checkpoint directory: the emergency save after its SIGTERM
    handling ends the epoch loop with ``SIGTERMException``), ``module: package.module:Name`` (your
    own LightningModule, or a function returning one, called with no arguments: it trains on its own
    ``train_dataloader`` in place of the workload's model and data; the workload keeps its
    ``steps``, ``checkpoint_every`` and world size).
    """

    drives_training = True
    options = ("dataloader", "save_top_k", "epoch_steps", "on_exception", "module")
    option_values: ClassVar[Mapping[str, Any]] = {"dataloader": LOADERS, "save_top_k": TOP_K,
                                                  "on_exception": (True, False), "epoch_steps": int}
    requires = {"pytorch_lightning": "pip install 'resilience[lightning]'",
                "torchdata": "pip install 'resilience[lightning]'"}

    @staticmethod
    def check_options(options: Mapping[str, Any]) -> tuple[str, str, Any, Any] | None:
        name = options.get("module")
        if name is not None and (not isinstance(name, str) or name.count(":") != 1 or name.startswith(":")
                                 or name.endswith(":")):
            return ("strategy.options.module", "must name a LightningModule", name, "package.module:Name")
        return None

    @classmethod
    def workload_options(cls, options: Mapping[str, Any]) -> frozenset[str] | None:
        """`WORKLOAD_OPTIONS` on the workload's model; none on a user's own module."""
        return frozenset() if options.get("module") else WORKLOAD_OPTIONS

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return (f"lightning-{lightning_version()}-{options.get('dataloader', 'plain')}-{options.get('epoch_steps', 0)}"
                f"-{options.get('module', 'workload')}")

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        from . import engine as lightning_engine

        own = (user_module_factory(options["module"]),) if options.get("module") else ()
        return (cls, lightning_engine.LightningTrainedWorkload, lightning_engine.WorkloadModule, *own)

    def prepare(self, workload: Workload) -> Workload:
        from .engine import LightningTrainedWorkload

        if self.context.options.get("module"):
            module = user_module_factory(self.context.options["module"])()
            self.workload = LightningTrainedWorkload(workload.spec, workload.rank, workload.world_size, module)
            return self.workload
        if not isinstance(workload, TrainableWorkload):
            raise TypeError(f"Lightning trains a TrainableWorkload; {type(workload).__name__} is not one")
        from .engine import WorkloadModule

        spec = workload.spec
        examples = len(workload.training_examples()[0])
        epoch_steps = int(self.context.options.get("epoch_steps", 0) or examples // spec.global_batch)
        micro_batch = spec.global_batch // self.context.world_size // int(spec.options.get("accumulation", 1))
        module = WorkloadModule(workload, micro_batch,
                                min(examples, epoch_steps * spec.global_batch),
                                self.context.options.get("dataloader", "plain"))
        self.workload = LightningTrainedWorkload(spec, workload.rank, workload.world_size, module)
        return self.workload

    def train(self, workload: Workload, observer: TrainingObserver) -> None:
        import pytorch_lightning as pl
        from pytorch_lightning.callbacks import ModelCheckpoint, OnExceptionCheckpoint
        from pytorch_lightning.strategies import DDPStrategy

        from .engine import SNAPSHOT_FILE, HarnessCallback, HarnessRanks, SaveReturned

        os.environ["PL_GLOBAL_SEED"] = str(workload.spec.seed)  # the DistributedSampler's shuffle seed
        directory = str(self.context.checkpoint_dir)
        options = workload.spec.options
        callbacks: list[Any] = []
        if "ema" in options:  # Lightning's own EMA at its defaults but the decay; before the harness's
            from pytorch_lightning.callbacks import EMAWeightAveraging  # callback, which digests the step

            self.workload.averaging = EMAWeightAveraging(decay=float(options["ema"]))
            callbacks.append(self.workload.averaging)
        callbacks.append(HarnessCallback(self.workload, observer))
        if observer.saves:
            callbacks.append(ModelCheckpoint(dirpath=directory, every_n_train_steps=observer.checkpoint_every,
                                             save_last=True, save_top_k=int(self.context.options.get("save_top_k", 1))))
            if self.context.options.get("on_exception"):
                callbacks.append(OnExceptionCheckpoint(dirpath=directory))
            callbacks.append(SaveReturned(observer))
        trainer = pl.Trainer(accelerator="cpu", devices=self.context.world_size, num_nodes=1,
                             strategy=DDPStrategy(cluster_environment=HarnessRanks(self.context),
                                                  process_group_backend="gloo"),
                             max_steps=observer.steps, max_epochs=-1, callbacks=callbacks,
                             accumulate_grad_batches=int(options.get("accumulation", 1)),
                             enable_checkpointing=observer.saves, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                             default_root_dir=directory)
        self.workload.trainer = trainer
        ckpt_path = {Start.FRESH: None, Start.STRATEGY: "last"}.get(observer.start)
        if observer.start == Start.SNAPSHOT:
            ckpt_path = str(observer.snapshot_path(observer.snapshot_step) / SNAPSHOT_FILE)
        trainer.fit(self.workload.module, ckpt_path=ckpt_path, weights_only=True)

    def save(self, workload: Workload, step: int) -> None:
        raise NotImplementedError("Lightning's ModelCheckpoint saves inside Trainer.fit")

    def load(self, workload: Workload) -> None:
        raise NotImplementedError("Lightning restores inside Trainer.fit(ckpt_path='last')")


def user_module_factory(name: str):
    """``package.module:Name`` -> the object it names (a LightningModule class or a function)."""
    import importlib

    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"strategy option module: {name!r} is not 'package.module:Name'")
    return getattr(importlib.import_module(module_name), attribute)
