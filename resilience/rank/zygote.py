"""Preloaded into the multiprocessing forkserver: torch is imported once, ranks are forked from it.

Importing this module makes the server process what a rank needs (single-threaded math, loopback
gloo) before torch loads, because OpenMP reads its settings when the library loads.
"""
from __future__ import annotations

import os

os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                   "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"})
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    # torch makes its compiler cache directory as soon as torch._dynamo loads (DeepSpeed's import
    # does: a torch.compile decorator), by default /tmp/torchinductor_<user>, and never removes
    # it; in the server's own multiprocessing directory it goes when the server exits
    from multiprocessing import util

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(util.get_temp_dir(), "torchinductor")

import torch  # noqa: E402
import torch.distributed  # noqa: E402,F401

from . import warm_rank, worker  # noqa: E402,F401  (and what they import: a rank's whole import cost, once)
from .. import strategies, faults  # noqa: E402,F401
from ..strategies.torch import native  # noqa: E402,F401

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


def _preload_deepspeed() -> None:
    """Where DeepSpeed is installed, pay its import (seconds, much of it torch.compile's stack,
    which its optimizer registry pulls in) here, once."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import importlib

    for module in ("deepspeed", "deepspeed.runtime.engine", "deepspeed.runtime.zero.stage_1_and_2",
                   "deepspeed.runtime.zero.stage3", "deepspeed.runtime.zero.muon.muon_optimizer",
                   "deepspeed.checkpoint", "deepspeed.utils", "resilience.strategies.deepspeed.zero"):
        importlib.import_module(module)


def _preload_dcp() -> None:
    """torch.distributed.checkpoint and FSDP2 (seconds of imports per rank otherwise); they start
    no threads."""
    import importlib
    import importlib.util

    modules = ["torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
               "torch.distributed.fsdp", "torch.distributed.device_mesh", "resilience.strategies.torch.dcp"]
    if importlib.util.find_spec("fsspec") is not None:
        modules.append("torch.distributed.checkpoint._fsspec_filesystem")
    for module in modules:
        importlib.import_module(module)


def _preload_megatron_core() -> None:
    """Where megatron-core is installed, its dist_checkpointing (2-3 s of imports per rank
    otherwise: its package init pulls in its tensor-parallel layers); it starts no threads. Its CUDA
    stubs are applied in the rank (``strategies/megatron/core_cpu.py``), never here."""
    import importlib
    import importlib.util
    import warnings

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": said in every rank
        warnings.simplefilter("ignore", UserWarning)
        for module in ("megatron.core.dist_checkpointing", "megatron.core.dist_checkpointing.optimizer",
                       "megatron.core.dist_checkpointing.strategies.async_utils",
                       "megatron.core.dist_checkpointing.strategies.fully_parallel",
                       "megatron.core.dist_checkpointing.strategies.torch", "resilience.strategies.megatron.core_checkpoint"):
            importlib.import_module(module)


_warm_up()
_preload_deepspeed()
_preload_dcp()
_preload_megatron_core()


def native_thread_count() -> int:
    """Threads of this process as the kernel sees them (fork copies only the calling one)."""
    return len(os.listdir("/proc/self/task"))


#: measured once the preload is done: forking is only safe from a single-threaded server
THREADS_AFTER_PRELOAD = native_thread_count()


def run_rank(plan_path: str, rank: int, out_path: str, err_path: str) -> None:
    """Entry point of a forked rank: own session (so its group can be killed), own log files."""
    _become_rank(out_path, err_path)
    worker.exit_now(worker.main(["worker", plan_path, str(rank)]))


def run_warm_rank(pool_dir: str, rank: int, world_size: int) -> None:
    """Entry point of a forked warm rank (`warm_rank.serve`)."""
    from pathlib import Path

    _become_rank(f"{pool_dir}/rank{rank}.out", f"{pool_dir}/rank{rank}.err")
    worker.exit_now(warm_rank.serve(Path(pool_dir), rank, world_size))


def _become_rank(out_path: str, err_path: str) -> None:
    os.setsid()
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    if THREADS_AFTER_PRELOAD != 1:
        os.write(2, f"unsafe fork: the forkserver had {THREADS_AFTER_PRELOAD} threads\n".encode())
        os._exit(70)
