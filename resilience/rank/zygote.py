"""Preloaded into the multiprocessing forkserver: torch is imported once, ranks are forked from it.

Importing this module makes the server process what a rank needs (single-threaded math, loopback
gloo) before torch loads, because OpenMP reads its settings when the library loads.
"""
from __future__ import annotations

# The order is the point: the environment before torch loads, then torch, then what a rank imports.
# isort: skip_file

import gc
import os

os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                   "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"})

import torch
import torch.distributed

from . import startup, warm_rank, worker  # (and what they import: a rank's whole import cost, once)
from .. import faults  # noqa: F401 -- preloaded too: every fault module, once
from ..strategies.stack import stacks

torch.set_num_threads(1)


def _warm_up() -> None:
    """Pay the lazy imports of a first optimizer step and a first save/load here, once: building
    Adam alone pulls in several hundred modules (torch._dynamo, sympy) on first use."""
    import io

    from ..core.case import WorkloadSpec
    from ..workloads.mlp import MLPWorkload

    spec = WorkloadSpec(model="mlp", world_size=1, steps=1, checkpoint_every=1, seed=0, global_batch=1,
                        size_bytes=4096, rank_rng="same")
    workload = MLPWorkload(spec, rank=0, world_size=1)
    for parameter in workload.model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    workload.optimizer.step()
    workload.scheduler.step()
    buffer = io.BytesIO()
    torch.save(workload.state_dict(), buffer)
    buffer.seek(0)
    workload.load_state_dict(torch.load(buffer, weights_only=True))
    workload.fingerprint()


def _preload_stacks() -> None:
    """Pay each installed stack's imports here, once, as its package declares them
    (`resilience.strategies.stack`); a module the installed release lacks is skipped."""
    cuda = torch.cuda.is_available()
    for stack in stacks():
        stack.run_preload(cuda)


_warm_up()
_preload_stacks()
gc.collect()  # the warm-up's garbage goes before the rest is frozen
# A collection in a rank (accelerate's free_memory, DeepSpeed's and Megatron's own) would walk every
# preloaded object: about 0.3 s of CPU each, and its writes to their headers copy the server's
# memory pages into the rank. Frozen, they are skipped (Python's advice for servers that fork).
gc.freeze()


def native_thread_count() -> int:
    """Threads of this process as the kernel sees them (fork copies only the calling one)."""
    return len(os.listdir("/proc/self/task"))


#: measured once the preload is done: forking is only safe from a single-threaded server
THREADS_AFTER_PRELOAD = native_thread_count()


def run_rank(plan_path: str, rank: int, out_path: str, err_path: str) -> None:
    """Entry point of a forked rank: own session (so its group can be killed), own log files."""
    _become_rank(out_path, err_path)
    startup.exit_now(worker.main(["worker", plan_path, str(rank)]))


def run_warm_rank(pool_dir: str, rank: int, world_size: int) -> None:
    """Entry point of a forked warm rank (`warm_rank.serve`)."""
    from pathlib import Path

    _become_rank(f"{pool_dir}/rank{rank}.out", f"{pool_dir}/rank{rank}.err")
    startup.exit_now(warm_rank.serve(Path(pool_dir), rank, world_size))


def _become_rank(out_path: str, err_path: str) -> None:
    os.setsid()
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    if THREADS_AFTER_PRELOAD != 1:
        os.write(2, f"unsafe fork: the forkserver had {THREADS_AFTER_PRELOAD} threads\n".encode())
        os._exit(70)
