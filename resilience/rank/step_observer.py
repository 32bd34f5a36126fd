"""What an unmodified training script does, seen from inside its rank process (black-box mode):
its losses, its step boundaries, a digest of its state before each step, and the files it writes.

A step is observed through two hooks torch offers every loop:

- ``torch.autograd.backward`` (``Tensor.backward`` calls it) is wrapped; only the outermost call
  on a one-element tensor counts (activation checkpointing calls it again inside the backward):
  its value is a micro-loss, as the script computed it (scaled by a ``GradScaler`` or divided by
  an accumulation count: a fingerprint of this rank, which the reference computes the same way);
- the global optimizer step hooks (``torch.optim.optimizer.register_optimizer_step_*_hook``):
  the first optimizer step after at least one backward is the step boundary. Further optimizer
  steps before the next backward (a second optimizer, one call per parameter group) belong to
  the same boundary; a ``GradScaler`` that skips a step on overflow skips the boundary, and that
  step's micro-losses count towards the next.

Before the boundary's optimizer step, the rank's state is digested in parts (`state_digest`): the
parameters the optimizer steps, its per-parameter state (moments, step counts; not the
hyperparameters a loop rewrites, such as ``lr``) and the RNG streams; after it, the state a save
of that step holds. The restored step of a restart is the step whose saved state holds the
parameters the restarted rank starts from; the other parts then say what else came back.

A restarted rank that trains no step (it restored the run's last checkpoint, so the script ends)
has no boundary to digest: the optimizers it loaded before any step
(``torch.optim.Optimizer.load_state_dict``, wrapped) are kept and digested as the process exits
normally (``exiting``), so the step it came back at is still found. A loop that loads its
optimizer's state by other means leaves such a restart's step unknown.

Where the hooks cannot see the loop (closures that call backward inside ``optimizer.step``,
pipeline schedules that call backward per micro-batch outside autograd's entry point, a loop with
no torch optimizer) the script's contract lines (`core.log_contract`) still override them.
"""
from __future__ import annotations

import hashlib
import random
import sys
from typing import Any, Callable

from ..core.events import ClockPhase, Event
from ..faults.listeners import ReadListener, WriteListener


def state_digest(optimizer: Any, rng: bool = True) -> dict[str, str]:
    """The optimizer's parameters, its per-parameter state and (``rng``) the RNG streams, each digested."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    parts = {"parameters": _tensors_digest(params)}
    entries = []
    for p in params:
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            entries += [str(key), value if isinstance(value, torch.Tensor) else repr(value)]
    parts["optimizer"] = _tensors_digest(entries)
    if not rng:
        return parts
    parts["torch_rng"] = _tensors_digest([torch.get_rng_state()])
    parts["python_rng"] = hashlib.blake2b(repr(random.getstate()).encode(), digest_size=12).hexdigest()
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # only where the script imported it: its state is then the script's
        parts["numpy_rng"] = hashlib.blake2b(repr(numpy.random.get_state()).encode(), digest_size=12).hexdigest()
    return parts


def _tensors_digest(items: list) -> str:
    import torch

    digest = hashlib.blake2b(digest_size=12)
    for item in items:
        if isinstance(item, torch.Tensor):
            data = item.detach().cpu().contiguous()
            digest.update(f"{data.dtype}{tuple(data.shape)}".encode())
            digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(str(item).encode())
    return digest.hexdigest()


class StepObserver:
    """Installs the hooks above in one rank process; ``emit`` puts what they see on record and
    ``on_phase(phase, step)`` / ``on_save_returned(step)`` tell the armed fault where the rank is.

    Call order, main thread: ``install()`` once, before the script's code runs; then torch calls
    the hooks. The rank's clock: ``train`` of step N from the first backward after boundary N-1;
    ``save`` of step N from the end of optimizer step N until the next backward (a script saves
    its checkpoint of step N there); a save of step N returned once the first backward of step
    N+1 begins.
    """

    def __init__(self, emit: Callable[..., None], on_phase: Callable[[str, int], None],
                 on_save_returned: Callable[[int], None]):
        self.emit, self.on_phase, self.on_save_returned = emit, on_phase, on_save_returned
        self.steps = 0  # boundaries seen
        self.micro_losses: list[float] = []
        self.depth = 0  # nesting of backward calls (any thread: the engine's re-entrant ones too)
        self.training = False  # between the first backward of a step and its boundary
        self.at_boundary = False  # inside the boundary's optimizer step
        self.loaded: list[Any] = []  # optimizers whose state was loaded before the first boundary

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        real_backward = torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            if self.depth == 0:
                self._before_backward(tensors)
            self.depth += 1
            try:
                return real_backward(tensors, *args, **kwargs)
            finally:
                self.depth -= 1

        torch.autograd.backward = backward
        real_load = torch.optim.Optimizer.load_state_dict

        def load_state_dict(optimizer, *args, **kwargs):
            result = real_load(optimizer, *args, **kwargs)
            if not self.steps and optimizer not in self.loaded:
                self.loaded.append(optimizer)  # kept to the exit: a restart may end without a step
            return result

        torch.optim.Optimizer.load_state_dict = load_state_dict
        register_optimizer_step_pre_hook(self._before_optimizer_step)
        register_optimizer_step_post_hook(self._after_optimizer_step)

    def exiting(self) -> None:
        """At a normal exit: the state a rank that trained no step restored (the last optimizer it loaded)."""
        if not self.steps and self.loaded:
            self.emit(Event.STATE_AT_EXIT, digest=state_digest(self.loaded[-1], rng=False))

    def _before_backward(self, tensors: Any) -> None:
        import torch

        loss = tensors if isinstance(tensors, torch.Tensor) else (tensors[0] if len(tensors) == 1 else None)
        if loss is None or loss.numel() != 1:
            return
        if not self.training:
            if self.steps:
                self.on_save_returned(self.steps)
            self.training = True
            self.on_phase(ClockPhase.TRAIN, self.steps + 1)
        self.micro_losses.append(float(loss.detach().float().sum()))

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.training or self.at_boundary:
            return  # no backward since the last boundary: the same step's second optimizer call
        self.steps += 1
        self.at_boundary = True
        self.loaded.clear()  # its digests say what was restored from now on
        self.emit(Event.OBSERVED_STEP, step=self.steps, loss=sum(self.micro_losses), micro_losses=self.micro_losses,
                  digest=state_digest(optimizer))
        self.micro_losses = []

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.at_boundary:
            return
        # the state a save of this step holds: what a restart's first step must start from
        self.emit(Event.STEP_DONE, step=self.steps, digest=state_digest(optimizer, rng=False))
        self.at_boundary = self.training = False
        self.on_phase(ClockPhase.SAVE, self.steps)


class WrittenFiles(WriteListener):
    """Every file the script opens for writing under the checkpoint directory, with the step the
    rank's clock was at (a save after step N, or a re-save right after a restore: step 0); at the
    open, so a file a fault cut short is on record too."""

    def __init__(self, emit: Callable[..., None], clock: Any):
        self.emit, self.clock = emit, clock
        self.save_steps: set[int] = set()  # steps in whose save this rank wrote a file

    def on_open(self, file) -> None:
        if self.clock.phase == ClockPhase.SAVE:
            self.save_steps.add(self.clock.step)
        self.emit(Event.FILE_WRITTEN, file=file.relative, step=self.clock.step, phase=self.clock.phase)


class ReadFiles(ReadListener):
    """The files a restarted rank opens for reading under the checkpoint directory before its
    first backward (its restore), each once, as ``file_read``. Pages of a memory-mapped file
    (safetensors' native reader, ``torch.load(mmap=True)``) are read past ``open``: such a file
    shows only where the library opens it through Python."""

    def __init__(self, emit: Callable[..., None], clock: Any):
        self.emit, self.clock = emit, clock
        self.seen: set[str] = set()

    def wants_read(self, relative: str) -> bool:
        return self.clock.phase == ClockPhase.LOAD and relative not in self.seen

    def on_open_read(self, path, relative: str) -> None:
        self.seen.add(relative)
        self.emit(Event.FILE_READ, file=relative)
