"""A user's own Accelerate training functions, named in a scenario as `strategy: {name: accelerate,
options: {function: tests.accelerate_user_functions:train, arguments: {steps: 8, save_every: 4}}}`:
one that resumes as Accelerate's documentation shows, and a twin that forgets to hand its LR
scheduler to ``prepare`` (so ``save_state`` never stores it)."""
from __future__ import annotations

from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration


class Position:
    """Epoch and batch within it, registered for checkpointing."""

    def __init__(self):
        self.step, self.epoch, self.batch = 0, 0, 0

    def state_dict(self):
        return {"step": self.step, "epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state):
        self.step, self.epoch, self.batch = state["step"], state["epoch"], state["batch"]


def train(project_dir: str, steps: int = 8, save_every: int = 4, prepare_scheduler: bool = True) -> None:
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=2),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(96, 8, generator=generator)
    targets = inputs @ torch.randn(8, 1, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 3, 0.5)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=8,
                                         shuffle=True, drop_last=True)
    if prepare_scheduler:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    else:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    position = Position()
    accelerator.register_for_checkpointing(position)
    folders = Path(project_dir) / "checkpoints"
    if folders.is_dir() and any(folders.iterdir()):
        accelerator.load_state()
        accelerator.project_configuration.iteration = 1 + max(int(p.name.rsplit("_", 1)[1]) for p in folders.iterdir())
    while position.step < steps:
        loader.set_epoch(position.epoch)
        batches = accelerator.skip_first_batches(loader, position.batch) if position.batch else loader
        for batch_inputs, batch_targets in batches:
            loss = ((model(batch_inputs) - batch_targets) ** 2).mean()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            position.step, position.batch = position.step + 1, position.batch + 1
            if position.step % save_every == 0:
                accelerator.save_state()
            if position.step >= steps:
                break
        else:
            position.epoch, position.batch = position.epoch + 1, 0
