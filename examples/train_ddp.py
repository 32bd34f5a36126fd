"""An ordinary data-parallel training script, written as people write them: plain torch.distributed,
a torch.save checkpoint every few steps, and a resume from the newest checkpoint directory. It knows
nothing of the resilience framework beyond printing the log contract's lines (README, black-box mode).

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --checkpoint-dir ckpt

``--skip-optimizer-restore`` is the bug to catch: the resume loads the model but not Adam's moments.
"""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist


def arguments():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--skip-optimizer-restore", action="store_true")
    return parser.parse_args()


def batch(step, global_batch, rank, world_size):
    """This rank's slice of the step's global batch: a pure function of the step, so a resume needs
    no data-loader state."""
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(global_batch, 16, generator=generator)
    targets = torch.tanh(inputs.sum(dim=1, keepdim=True))
    local = global_batch // world_size
    return inputs[rank * local:(rank + 1) * local], targets[rank * local:(rank + 1) * local]


def join(backend):
    """init_process_group, under a key prefix of this restart when torchrun's agent hosts the store:
    the agent keeps one store for every restart of a job, and a restarted group that reads the
    addresses its dead predecessor published fails ("Gloo connectFullMesh failed ... Connection
    refused") or waits (seen with torch 2.13 on gloo)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend)
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"restart{restart}", store), rank=rank,
                            world_size=world_size)


def newest_checkpoint(directory):
    steps = sorted(int(p.name.split("_")[1]) for p in directory.glob("step_*") if p.is_dir())
    return directory / f"step_{steps[-1]}" / "checkpoint.pt" if steps else None


def main():
    args = arguments()
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    join("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)

    start = 0
    path = newest_checkpoint(args.checkpoint_dir)
    if path is not None:
        state = torch.load(path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        if not args.skip_optimizer_restore:
            optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    print(f"RESILIENCE restored step={start}", flush=True)

    for step in range(start + 1, args.steps + 1):
        inputs, targets = batch(step, args.global_batch, rank, world_size)
        optimizer.zero_grad()
        loss = ((model(inputs.to(device)) - targets.to(device)) ** 2).sum() / args.global_batch
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        total = loss.detach().clone()
        dist.all_reduce(total)
        optimizer.step()
        print(f"RESILIENCE step={step} loss={total.item().hex()}", flush=True)
        if step % args.checkpoint_every == 0:
            if rank == 0:
                directory = args.checkpoint_dir / f"step_{step}"
                directory.mkdir(parents=True, exist_ok=True)
                torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                           directory / "checkpoint.pt")
            dist.barrier()
            print(f"RESILIENCE saved step={step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
