"""The two CUDA calls megatron-core's ``dist_checkpointing`` makes on a CPU-only save, stubbed in the
rank so that the rest of its real code runs (megatron-core 0.16.1; the same calls from 0.8 to 0.19):

- ``torch.cuda.synchronize`` becomes a no-op: it waits for device-to-host copies that a CPU tensor
  never makes (``strategies/filesystem_async.py:230`` ``FileSystemWriterAsync.preload_tensors``;
  ``strategies/async_utils.py:212`` ``TemporalAsyncCaller.schedule_async_call``;
  ``strategies/fully_parallel.py:272,281`` ``FullyParallelLoadStrategyWrapper.load``).
- ``torch.cuda.current_device`` returns the CPU device: it is only the device of one-element
  tensors reduced over the process group, which gloo reduces on the CPU
  (``strategies/state_dict_saver.py:252`` ``save_state_dict_async_finalize``;
  ``strategies/async_utils.py:165`` ``sync_all_async_calls``; ``async_utils.py:604``
  ``AsyncCallsQueue.maybe_finalize_async_calls``).

Applied only where ``torch.cuda.is_available()`` is false, never on a GPU machine. Nothing else
is stubbed; an option whose path needs real CUDA semantics is refused (``megatron_core.py``).
"""
from __future__ import annotations

import torch

STUBBED = ("torch.cuda.synchronize", "torch.cuda.current_device")


def _synchronize(device=None) -> None:
    """No device work exists to wait for on a CPU-only machine."""


def _current_device() -> torch.device:
    return torch.device("cpu")


def apply_cpu_stubs() -> tuple[str, ...]:
    """Stub the two calls in this process when CUDA is absent; returns the names stubbed (none on a
    GPU machine). Forked children (megatron-core's writer workers) inherit them."""
    if torch.cuda.is_available():
        return ()
    torch.cuda.synchronize = _synchronize
    torch.cuda.current_device = _current_device
    return STUBBED
