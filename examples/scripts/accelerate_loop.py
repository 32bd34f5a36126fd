"""A training loop of the common Hugging Face Accelerate shape: ``Accelerator()`` prepares the model,
optimizer and data loader (DDP over gloo on CPU under torchrun), ``accelerator.backward(loss)``,
dropout, a shuffled ``DataLoader``, and ``accelerator.save_state(out/step_N)`` every
``--save-every`` steps (model.safetensors, optimizer.bin, the sampler and every rank's RNG
states). It resumes from the highest-numbered ``step_N`` where one exists, skipping the batches of
the epoch it already trained (``accelerator.skip_first_batches``). Each rank prints its own loss.

    torchrun --standalone --nproc-per-node 2 examples/scripts/accelerate_loop.py --out-dir out

With ``--dropout 0.1`` the resume is not bitwise: every new DataLoader iterator draws its base
seed from torch's global generator (torch 2.13, ``torch/utils/data/dataloader.py:690-692``, with no
worker too), so the iterator the resume creates after ``load_state`` draws once more than the
uninterrupted run did, and every later dropout mask shifts.
"""
import argparse
import os
import re

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def newest_state(out_dir):
    steps = [int(m.group(1)) for name in (os.listdir(out_dir) if os.path.isdir(out_dir) else [])
             if (m := re.fullmatch(r"step_(\d+)", name))]
    return max(steps, default=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args()

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    inputs = torch.randn(96, 8)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).tanh())
    loader = DataLoader(dataset, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(args.dropout),
                                torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    step = newest_state(args.out_dir)
    if step:
        accelerator.load_state(os.path.join(args.out_dir, f"step_{step}"))
    per_epoch = len(loader)
    while step < args.steps:
        epoch, done = divmod(step, per_epoch)
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, done) if done else loader
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            print(f"step {step} loss {loss.item():.6f}", flush=True)
            if step % args.save_every == 0:
                accelerator.save_state(os.path.join(args.out_dir, f"step_{step}"))
            if step >= args.steps:
                break
    accelerator.end_training()


if __name__ == "__main__":
    main()
