"""A user's own Accelerate training function as the system under test, unchanged: every rank calls
it with the scenario's arguments and the checkpoint directory; the harness observes through
Accelerate's own methods, wrapped for the call and restored after it:

- ``Accelerator.__init__``: the harness registers a step counter of its own for checkpointing
  (first, so ``save_state`` stores it as ``custom_checkpoint_0.pkl`` and ``load_state`` restores it);
- ``Accelerator.backward(loss)``: the step before it is complete (``after_step``: the user's
  scheduler step and ``zero_grad`` have run), a step begins (``before_step``: a fault may fire), and
  the global loss is the mean of ``loss`` over the ranks;
- the prepared optimizer's ``step``: the step counter moves;
- ``Accelerator.save_state`` / ``load_state``: ``before_save`` / ``after_save``, and ``restored``
  after a load (a function that never loads is restored from nothing at its first ``backward``);
  in a phase that keeps no checkpoint (the reference run) ``save_state`` returns without saving.

The state fingerprints see: the counter, and every model, optimizer and scheduler the user passed
to ``prepare``. A restart at another world size is not offered (no trusted snapshot of a user's
state exists). Accelerate is imported only inside rank processes.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch.distributed as dist

from ...core.plan import Start
from ...workloads.base import Workload
from ..base import TrainingObserver


def user_function(name: str):
    """``package.module:name`` -> the function it names."""
    module_name, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


class StepCounter:
    """The harness's step count, registered with ``register_for_checkpointing``."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class UserFunctionWorkload(Workload):
    """What a user's Accelerate function trains, as fingerprints see it."""

    def __init__(self, spec: Any, rank: int, world_size: int):
        super().__init__(spec, rank, world_size)
        self.counter = StepCounter()
        self.accelerator: Any = None

    @property
    def step(self) -> int:
        return self.counter.step

    def train_step(self) -> float:
        raise NotImplementedError("the user's Accelerate function computes its own steps")

    def state_dict(self) -> dict[str, Any]:
        accelerator = self.accelerator
        return {"step": self.step, "models": [m.state_dict() for m in accelerator._models],
                "optimizers": [o.state_dict() for o in accelerator._optimizers],
                "schedulers": [s.state_dict() for s in accelerator._schedulers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError("the user's function restores its own checkpoints (Accelerator.load_state)")

    def save_reference_snapshot(self, directory) -> None:
        raise NotImplementedError("a restart at another world size is not offered for a user's Accelerate "
                                  "function: no trusted snapshot of its state exists")


class Observed:
    """The wrapped Accelerate methods for one call of the user's function (one per rank)."""

    def __init__(self, workload: UserFunctionWorkload, observer: TrainingObserver):
        self.workload, self.observer = workload, observer
        self.is_restored, self.pending_loss = False, None
        self.stepped = False
        self._saved: list[tuple[Any, str, Any]] = []

    def _ensure_restored(self) -> None:
        if not self.is_restored:
            self.is_restored = True
            self.observer.restored(self.workload)

    def complete_step(self) -> None:
        if self.stepped:
            self.stepped = False
            self.observer.after_step(self.workload, self.workload.step, self.pending_loss)

    def install(self) -> None:
        from accelerate import Accelerator
        from accelerate.optimizer import AcceleratedOptimizer

        real = {"init": Accelerator.__init__, "backward": Accelerator.backward, "save": Accelerator.save_state,
                "load": Accelerator.load_state, "step": AcceleratedOptimizer.step}
        observed = self

        def init(accelerator, *args, **kwargs):
            real["init"](accelerator, *args, **kwargs)
            observed.workload.accelerator = accelerator
            accelerator.register_for_checkpointing(observed.workload.counter)

        def backward(accelerator, loss, **kwargs):
            observed._ensure_restored()
            observed.complete_step()
            observed.observer.before_step(observed.workload.step + 1)
            total = loss.detach().clone().reshape(1)
            dist.all_reduce(total)
            observed.pending_loss = float(total[0]) / observed.workload.world_size
            return real["backward"](accelerator, loss, **kwargs)

        def step(optimizer, *args, **kwargs):
            result = real["step"](optimizer, *args, **kwargs)
            if observed.pending_loss is not None and not observed.stepped:
                observed.workload.counter.step += 1
                observed.stepped = True
            return result

        def save_state(accelerator, *args, **kwargs):
            observed.complete_step()
            if not observed.observer.saves:  # the reference run: it keeps no checkpoint of its own
                return None
            saved_step = observed.workload.step
            observed.observer.before_save(saved_step)
            result = real["save"](accelerator, *args, **kwargs)
            observed.observer.after_save(saved_step)
            return result

        def load_state(accelerator, *args, **kwargs):
            result = real["load"](accelerator, *args, **kwargs)
            observed._ensure_restored()
            return result

        for owner, name, new in ((Accelerator, "__init__", init), (Accelerator, "backward", backward),
                                 (Accelerator, "save_state", save_state), (Accelerator, "load_state", load_state),
                                 (AcceleratedOptimizer, "step", step)):
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, new)

    def uninstall(self) -> None:
        while self._saved:
            owner, name, old = self._saved.pop()
            setattr(owner, name, old)


def train_user_function(name: str, arguments: dict[str, Any], directory_argument: str, checkpoint_dir: str,
                        workload: UserFunctionWorkload, observer: TrainingObserver) -> None:
    """Call the user's function once on this rank, observed; every rank calls it together."""
    if observer.start == Start.SNAPSHOT:
        raise NotImplementedError("a restart at another world size is not offered for a user's Accelerate "
                                  "function: no trusted snapshot of its state exists")
    observed = Observed(workload, observer)
    observed.install()
    try:
        user_function(name)(**arguments, **{directory_argument: checkpoint_dir})
        observed._ensure_restored()
        observed.complete_step()
    finally:
        observed.uninstall()
