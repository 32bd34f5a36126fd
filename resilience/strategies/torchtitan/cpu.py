"""The three shims that let torchtitan 0.3.0's own code run on a CPU under gloo, each the smallest
that unblocks it; everything else is the library's code as released.

1. ``torchtitan/distributed/minimal_async_ep/kernels.py:10`` imports ``triton``, reached from every
   model (``models/common/__init__.py:24`` -> ``decoder.py`` -> ``moe.py`` -> ``token_dispatcher.py``
   -> ``minimal_async_ep/api.py:30``) though only mixture-of-experts dispatch on GPUs calls it. A
   stub of that one module (the eight kernels ``api.py:30-39`` names, each raising if called)
   stands in; ``triton`` itself is not faked, so torch's own triton checks stay true.
2. ``torchtitan/tools/utils.py:55`` resolves the device at import as ``_get_available_device_type()
   or "cuda"``; on a CPU machine that is ``cuda``, and ``init_device_mesh("cuda")`` fails
   (``parallel_dims.py:281``). The module's ``device_type`` and ``device_module`` are set to the CPU
   before any module copies them (``parallel_dims.py:19``, ``distributed/utils.py:30``).
3. ``distributed/fsdp.py:41`` sets FSDP2's gradient divide factor to 1.0, which makes FSDP2
   reduce-scatter with ``ReduceOp.PREMUL_SUM``; gloo refuses it. Every FSDP module is told to
   reduce with a plain SUM (``set_force_sum_reduction_for_comms``), then divide by that factor
   of 1.0: the same numbers.
"""
from __future__ import annotations

import sys
import types

KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
KERNEL_NAMES = ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                "reduce_topk_slots_kernel", "topk_scores_grad_kernel")


def _unavailable(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(f"{name}: a triton kernel, not available on the CPU")
    return kernel


def install() -> None:
    """Shims 1 and 2: call before the first import of a torchtitan model or of its parallel code."""
    import torch

    if KERNELS not in sys.modules:
        stub = types.ModuleType(KERNELS)
        for name in KERNEL_NAMES:
            setattr(stub, name, _unavailable(name))
        sys.modules[KERNELS] = stub
    import torchtitan.tools.utils as tools

    if not torch.cuda.is_available():
        tools.device_type, tools.device_module = "cpu", torch.cpu


def sum_reductions(model) -> None:
    """Shim 3, on a model torchtitan's ``parallelize_llama`` wrapped."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
