"""Collectives as markers in the IO trace: the points that bound how the ranks' ops interleave.

A collective that every rank joins (a barrier, a broadcast of the save's plan) completes on no rank
before every rank has entered it, so no rank's file op after it happens before any rank's op before
it. `resilience.disk.interleaving` orders the traced ops by those points. The hooks wrap the
collectives of ``torch.distributed`` (and of ``distributed_c10d``, where torch's own helpers look
them up); the libraries under test call them through the module (``torch.distributed.barrier``,
``dist.all_gather_object``), so they see the wrapped ones. Only the outermost call is reported (an
object collective runs tensor collectives inside), only a blocking one (``async_op=True`` returns
before it completes) and only over the whole world (a subgroup orders only its members).
"""
from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

COLLECTIVES = ("barrier", "monitored_barrier", "all_reduce", "broadcast", "reduce", "all_gather",
               "all_gather_into_tensor", "all_gather_object", "broadcast_object_list", "gather",
               "gather_object", "scatter", "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor",
               "all_to_all", "all_to_all_single")


class CollectiveHooks:
    """Calls ``report(name)`` after each blocking whole-world collective returns in this process
    while ``active()`` says so (a save is being traced: training's all-reduces pay one call).
    Installed once per rank process; ``uninstall`` restores the originals."""

    def __init__(self, report: Callable[[str], None], active: Callable[[], bool] = lambda: True):
        self.report, self.active = report, active
        self._saved: list[tuple[Any, str, Any]] = []
        self._depth = threading.local()

    def install(self) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        for name in COLLECTIVES:
            real = getattr(c10d, name, None)
            if real is None:
                continue
            hooked = self._wrap(name, real, dist)
            for module in (dist, c10d):
                if getattr(module, name, None) is real:
                    self._saved.append((module, name, real))
                    setattr(module, name, hooked)

    def _wrap(self, name: str, real: Callable, dist: Any) -> Callable:
        signature = inspect.signature(real)

        @functools.wraps(real)
        def hooked(*args, **kwargs):
            depth = getattr(self._depth, "value", 0)
            self._depth.value = depth + 1
            try:
                result = real(*args, **kwargs)
            finally:
                self._depth.value = depth
            if depth == 0 and self.active():
                bound = signature.bind_partial(*args, **kwargs).arguments
                if not bound.get("async_op") and _whole_world(dist, bound.get("group")):
                    self.report(name)
            return result

        return hooked

    def uninstall(self) -> None:
        while self._saved:
            module, name, real = self._saved.pop()
            setattr(module, name, real)


def _whole_world(dist: Any, group: Any) -> bool:
    if group is None or group is dist.GroupMember.WORLD:
        return True
    try:
        return dist.get_world_size(group) == dist.get_world_size()
    except (RuntimeError, ValueError):
        return False
