"""A user's own LightningModules, named in a scenario as `strategy: {name: lightning, options:
{module: tests.lightning_user_modules:TinyRegression}}`: one that resumes correctly and a twin
whose training depends on state its checkpoint does not hold."""
from __future__ import annotations

import pytorch_lightning as pl
import torch


class TinyRegression(pl.LightningModule):
    """Linear regression with SGD + momentum and a step LR schedule, on 96 fixed examples."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)
        generator = torch.Generator().manual_seed(1)
        self.inputs = torch.randn(96, 8, generator=generator)
        self.targets = self.inputs @ torch.randn(8, 1, generator=generator)

    def loss_scale(self) -> float:
        return 1.0

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return ((self.layer(inputs) - targets) ** 2).mean() * self.loss_scale()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 3, 0.5), "interval": "step"}}

    def train_dataloader(self):
        from torchdata.stateful_dataloader import StatefulDataLoader

        dataset = torch.utils.data.TensorDataset(self.inputs, self.targets)
        return StatefulDataLoader(dataset, batch_size=8, drop_last=True,
                                  sampler=torch.utils.data.RandomSampler(dataset))


class ForgetsItsScale(TinyRegression):
    """The planted bug: a loss scale that decays every step lives in a non-persistent buffer, so
    no checkpoint holds it and a resumed run trains with the initial scale."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()), persistent=False)

    def loss_scale(self):
        return self.scale

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.scale.mul_(0.8)
