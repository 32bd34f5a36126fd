"""A minimal GPT-style trainer of the common single-file shape: DDP over a plain
``init_process_group()``, a per-rank seed, random batches drawn from the global RNG, dropout, AdamW,
and one checkpoint file, ``ckpt.pt``, overwritten in place by rank 0 every ``--save-interval``
steps. A run resumes only when told (``--init-from resume``, or ``auto``: where ckpt.pt exists).
Each rank prints its own loss.

    torchrun --standalone --nproc-per-node 2 examples/scripts/gpt_trainer.py --out-dir out
    torchrun --standalone --nproc-per-node 2 examples/scripts/gpt_trainer.py --out-dir out --init-from resume

``--forget-rng`` is a common bug to catch: the resume reseeds instead of restoring the RNG state, so
the batches and dropout masks after it are those of step 0. ``--loss-noise A`` makes the run not
reproducible, as a reduction whose order varies does: each loss gets up to ``A`` of noise from the
operating system (the gradients stay exact). ``--stale-rng-after-resume`` is a bug only a second
resume shows: a resumed run saves the RNG states it loaded (a copy kept from the checkpoint and
never refreshed) instead of the current ones, so its own saves restore the streams of an older step.
``--save-atomically`` is the usual repair of the save in place: write ``ckpt.pt.tmp``, fsync it,
rename it over ``ckpt.pt``, fsync the directory.
"""
import argparse
import math
import os
import random

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

VOCAB, BLOCK, EMBED, HEADS = 64, 16, 32, 2


class Block(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(EMBED), nn.LayerNorm(EMBED)
        self.attention = nn.MultiheadAttention(EMBED, HEADS, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(EMBED, 4 * EMBED), nn.GELU(), nn.Linear(4 * EMBED, EMBED),
                                 nn.Dropout(dropout))
        self.register_buffer("causal", torch.triu(torch.ones(BLOCK, BLOCK, dtype=torch.bool), diagonal=1))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=self.causal[:x.size(1), :x.size(1)], need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, EMBED), nn.Embedding(BLOCK, EMBED)
        self.drop, self.block, self.norm = nn.Dropout(dropout), Block(dropout), nn.LayerNorm(EMBED)
        self.head = nn.Linear(EMBED, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.drop(self.tokens(idx) + self.positions(torch.arange(idx.size(1))))
        logits = self.head(self.norm(self.block(x)))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def save_atomically(checkpoint, path):
    with open(path + ".tmp", "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def get_batch(data, batch_size):
    ix = torch.randint(len(data) - BLOCK - 1, (batch_size,))
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])
    return x, y


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--init-from", choices=("scratch", "resume", "auto"), default="scratch",
                        help="auto: resume where ckpt.pt exists (torchrun's own restarts then resume)")
    parser.add_argument("--max-iters", type=int, default=12)
    parser.add_argument("--save-interval", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--forget-rng", action="store_true")
    parser.add_argument("--loss-noise", type=float, default=0.0)
    parser.add_argument("--save-atomically", action="store_true")
    parser.add_argument("--stale-rng-after-resume", action="store_true")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(1337 + rank)
    data = (torch.arange(4096) * 7 + torch.arange(4096) // 13) % VOCAB  # a fixed token stream

    model = GPT(args.dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, foreach=False)
    iter_num, loaded_rng = 0, None
    ckpt_path = os.path.join(args.out_dir, "ckpt.pt")
    if args.init_from == "resume" or (args.init_from == "auto" and os.path.exists(ckpt_path)):
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num, loaded_rng = checkpoint["iter_num"], checkpoint["rng"]
        if not args.forget_rng:
            torch.set_rng_state(checkpoint["rng"][rank])
    model = DistributedDataParallel(model)

    while iter_num < args.max_iters:
        lr = 3e-3 * 0.5 * (1 + math.cos(math.pi * iter_num / args.max_iters))  # rewritten every step
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(data, args.batch_size)
        loss = model(x, y)
        if args.loss_noise:
            loss = loss + args.loss_noise * (random.SystemRandom().random() * 2 - 1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        iter_num += 1
        print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)
        if iter_num % args.save_interval == 0:
            rng = [None] * dist.get_world_size()
            dist.all_gather_object(rng, torch.get_rng_state())
            if args.stale_rng_after_resume and loaded_rng is not None:
                rng = loaded_rng
            if rank == 0:
                checkpoint = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                              "iter_num": iter_num, "rng": rng}
                if args.save_atomically:
                    save_atomically(checkpoint, ckpt_path)
                else:
                    torch.save(checkpoint, ckpt_path)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
