"""PyTorch Lightning as it trains a workload: the cluster environment that makes the harness's
ranks Lightning's processes, the `LightningModule` over the workload's model, optimizer and LR
schedule, the callback through which the harness observes ``Trainer.fit``, and the workload whose
steps ``Trainer.fit`` computes. What decides the numbers of a Lightning-trained run lives here: the
reference cache is keyed on this module's source.

Lightning is imported only inside rank processes (by the strategy's ``prepare``), so the harness
and the scenario loader work without it.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from lightning_fabric.plugins.environments import ClusterEnvironment
from pytorch_lightning import Callback, LightningModule
from pytorch_lightning.callbacks import Checkpoint

from ...workloads.base import TrainableWorkload, Workload
from ..base import StrategyContext, TrainingObserver

SNAPSHOT_FILE = "lightning.ckpt"  # the trusted snapshot: the reference run's own state, dumped by Lightning


class HarnessRanks(ClusterEnvironment):
    """The harness's rank processes as Lightning's: created outside Lightning, their process group
    already initialised (Lightning's DDP then uses it as it is and never reads the address)."""

    def __init__(self, context: StrategyContext):
        super().__init__()
        self.context = context

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return "127.0.0.1"

    @property
    def main_port(self) -> int:
        return 0

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self.context.world_size

    def set_world_size(self, size: int) -> None:
        pass  # the harness decides it

    def global_rank(self) -> int:
        return self.context.rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return self.context.local_rank

    def node_rank(self) -> int:
        return self.context.node


class WorkloadModule(LightningModule):
    """The workload's model, optimizer and step-wise LR schedule as a LightningModule; its data as
    a `DataLoader` over the workload's examples that Lightning gives a `DistributedSampler`."""

    def __init__(self, inner: TrainableWorkload, local_batch: int, examples: int, loader: str):
        super().__init__()
        self.inner, self.local_batch, self.examples, self.loader = inner, local_batch, examples, loader
        self.net = inner.model

    def training_step(self, batch, batch_idx):
        _, inputs, targets = batch  # the sample indices are for the data audit (the harness's callback)
        return self.inner.local_loss(self.net(inputs), targets)

    def configure_optimizers(self):
        return {"optimizer": self.inner.optimizer,
                "lr_scheduler": {"scheduler": self.inner.scheduler, "interval": "step"}}

    def train_dataloader(self):
        inputs, targets = self.inner.training_examples()
        # each item carries its index: the data audit reads which samples a batch held from the batch
        dataset = torch.utils.data.TensorDataset(torch.arange(self.examples), inputs[:self.examples],
                                                 targets[:self.examples])
        if self.loader == "plain":  # shuffle=True: Lightning replaces its RandomSampler by a DistributedSampler
            return torch.utils.data.DataLoader(dataset, batch_size=self.local_batch, shuffle=True, drop_last=True)
        from torchdata.stateful_dataloader import StatefulDataLoader

        if self.loader == "stateful":  # its own torchdata RandomSampler, as shuffle=True makes it
            return StatefulDataLoader(dataset, batch_size=self.local_batch, shuffle=True, drop_last=True)
        # torch's RandomSampler, which Lightning replaces by a DistributedSampler (seeded per epoch)
        return StatefulDataLoader(dataset, batch_size=self.local_batch, drop_last=True,
                                  sampler=torch.utils.data.RandomSampler(dataset))


class BatchSteps:
    """Whether the batch that just ended stepped the optimizer: ``global_step`` moved since the
    batch began (with ``accumulate_grad_batches`` only a step's last batch moves it)."""

    def __init__(self) -> None:
        self.step_at_start = -1

    def began(self, trainer) -> None:
        self.step_at_start = trainer.global_step

    def stepped(self, trainer) -> bool:
        return trainer.global_step != self.step_at_start


class HarnessCallback(Callback):
    """The harness's eyes in ``Trainer.fit``. Lightning runs checkpoint callbacks after all others,
    so this callback's ``on_train_batch_end`` comes before ModelCheckpoint's save of the step. With
    ``accumulate_grad_batches`` a step is several batches: the observer hears of the step at its
    first, of a micro-step before each other, and of its end (loss, samples) after its last."""

    def __init__(self, workload: "LightningTrainedWorkload", observer: TrainingObserver):
        self.workload, self.observer = workload, observer
        self.batches, self.in_step, self.samples, self.loss = BatchSteps(), False, [], 0.0

    def on_train_start(self, trainer, pl_module):
        self.observer.restored(self.workload)  # Lightning restored the checkpoint before this hook

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.began(trainer)
        if self.in_step:
            self.observer.between_micro_steps(trainer.global_step + 1)
            return
        self.in_step, self.samples, self.loss = True, [], 0.0
        self.observer.before_step(trainer.global_step + 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if isinstance(pl_module, WorkloadModule):  # a user's module: its batches' layout is its own
            self.samples += batch[0].tolist()
        self.loss += float(outputs["loss"])  # a micro-batch's loss, as Lightning scales it
        if not self.batches.stepped(trainer):
            return
        step, self.in_step = trainer.global_step, False
        self.workload.last_samples = self.samples
        total = torch.tensor([self.loss])
        dist.all_reduce(total)
        self.observer.after_step(self.workload, step, float(total[0]) / trainer.world_size)
        if self.observer.snapshot_due(step):
            self.workload.save_reference_snapshot(self.observer.snapshot_path(step))
        if self.observer.saves and step % self.observer.checkpoint_every == 0:
            self.observer.before_save(step)


class SaveReturned(Checkpoint):
    """Marks the step's save returned. A `Checkpoint` callback: Lightning runs those after all
    others, in the order given, so this one comes after ModelCheckpoint (and OnExceptionCheckpoint)."""

    def __init__(self, observer: TrainingObserver):
        self.observer, self.batches = observer, BatchSteps()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.began(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.batches.stepped(trainer) and self.observer.saves and step % self.observer.checkpoint_every == 0:
            self.observer.after_save(step)


class LightningTrainedWorkload(Workload):
    """The workload whose steps ``Trainer.fit`` computes over ``module`` (the built-in
    `WorkloadModule`, or a user's own LightningModule). Its state (what fingerprints see): the step,
    the module's parameters and buffers, every optimizer's and LR scheduler's state, as the
    trainer holds them, and with the workload's options the EMA callback's average and the process's
    torch RNG (which dropout draws from); the data position lives in Lightning's loops and its data
    loader, and shows in the losses after a restore."""

    def __init__(self, spec: Any, rank: int, world_size: int, module: LightningModule):
        super().__init__(spec, rank, world_size)
        self.module = module
        self.trainer: Any = None
        self.averaging: Any = None  # Lightning's EMAWeightAveraging callback, with the ``ema`` option

    @property
    def step(self) -> int:
        return self.trainer.global_step if self.trainer is not None else 0

    def train_step(self) -> float:
        raise NotImplementedError("Trainer.fit computes the steps of a Lightning-trained workload")

    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        state = {"step": self.step, "model": self.module.state_dict(),
                 "optimizers": [optimizer.state_dict() for optimizer in trainer.optimizers],
                 "schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs]}
        # the callback's AveragedModel (built at the fit's setup; no public accessor in 2.6.6)
        average = getattr(self.averaging, "_average_model", None)
        if average is not None:  # the averaged weights and their count, as the callback saves them
            state["ema"] = average.state_dict()
        if self.spec.options.get("dropout"):  # the stream dropout draws from
            state["torch_rng"] = torch.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError("Lightning restores its own checkpoints (Trainer.fit(ckpt_path=...))")

    def save_reference_snapshot(self, directory) -> None:
        """The reference run's own state as Lightning dumps it (collective: rank 0 writes, all wait);
        the oracle's continuation starts ``Trainer.fit`` from it."""
        self.trainer.save_checkpoint(str(directory / SNAPSHOT_FILE))
