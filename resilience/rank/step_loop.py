"""The harness's training loop in a rank and its observer: what happens around every step and every
save (clock, fault triggers, loss and state events, trusted snapshots). The built-in loop calls the
observer itself; a strategy whose library runs its own loop (``drives_training``) calls the same
observer from the library's extension points, so both report through one implementation."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.capabilities import Capability
from ..core.events import ClockPhase, Event
from ..core.plan import PhasePlan, Start
from ..disk.read_interception import ReadCounter, ReadInterceptor
from ..strategies.base import CheckpointStrategy, TrainingObserver
from ..workloads.base import Workload


class HarnessObserver(TrainingObserver):
    """Events, clock and fault triggers of one rank's phase, around the steps and saves."""

    def __init__(self, plan: PhasePlan, steps: int, checkpoint_every: int, clock: Any, fault: Any,
                 strategy: CheckpointStrategy, emit: Any):
        self.plan, self.clock, self.fault, self.strategy, self.emit = plan, clock, fault, strategy, emit
        self.start, self.saves = plan.start, plan.save
        self.steps, self.checkpoint_every = steps, checkpoint_every
        self.snapshot_step = plan.snapshot_step
        self.snapshots = Path(plan.snapshot_dir) if plan.snapshot_dir else None
        self.load_started: float | None = None
        self.saved_step: int | None = None

    def restored(self, workload: Workload, **tier: Any) -> None:
        """``tier``: where a tiered strategy's restore came from (`load_reporting_tier`)."""
        import time

        self.clock.phase = ClockPhase.IDLE
        load_s = time.monotonic() - self.load_started if self.load_started is not None else 0.0
        self.emit(Event.RESTORED, step=workload.step, fingerprint=workload.fingerprint(), load_s=load_s, **tier)
        if self.start == Start.STRATEGY:
            self.saved_step = workload.step
        if self.plan.record_states and self.snapshots is not None and self.start == Start.FRESH:
            workload.save_reference_snapshot(self.snapshot_path(workload.step))

    def before_step(self, step: int) -> None:
        self.clock.phase, self.clock.step = ClockPhase.TRAIN, step
        if self.fault:
            self.fault.at(ClockPhase.TRAIN, step)

    def between_micro_steps(self, step: int) -> None:
        if self.fault:
            self.fault.between_micro_steps(step)

    def after_step(self, workload: Workload, step: int, loss: float) -> None:
        self.clock.phase = ClockPhase.IDLE
        samples = workload.consumed_samples()  # the data audit: what the step's batch held
        self.emit(Event.LOSS, step=step, loss=loss, **({"samples": samples} if samples is not None else {}))
        if self.plan.record_states:  # every step: an emergency save (on SIGTERM) may restore any of them
            self.emit(Event.STATE, step=step, fingerprint=workload.fingerprint())

    def snapshot_due(self, step: int) -> bool:
        return self.plan.record_states and self.snapshots is not None and step % self.checkpoint_every == 0

    def snapshot_path(self, step: int) -> Path:
        return self.snapshots / f"step_{step}"

    def before_save(self, step: int) -> None:
        self.clock.phase, self.clock.save_step = ClockPhase.SAVE, step
        self.emit(Event.SAVE_BEGIN, step=step)
        if self.fault:
            self.fault.at(ClockPhase.SAVE, step)

    def after_save(self, step: int) -> None:
        self.clock.phase = ClockPhase.IDLE
        self.emit(Event.SAVE_RETURNED, step=step)
        if self.fault:
            self.fault.after_save(self.strategy, step)
        self.saved_step = step


def load_reporting_tier(strategy: CheckpointStrategy, workload: Workload, checkpoint_dir: Path) -> dict[str, Any]:
    """``strategy.load(workload)``; for a strategy with several tiers (``RESTORE_TIERS``), the tier
    that served this rank and the bytes its load read under ``checkpoint_dir`` (its storage tier),
    as the ``restored`` event carries them."""
    if not strategy.offers(Capability.RESTORE_TIERS):
        strategy.load(workload)
        return {}
    counter = ReadCounter()
    interceptor = ReadInterceptor(checkpoint_dir, [counter])
    interceptor.install()
    try:
        strategy.load(workload)
    finally:
        interceptor.uninstall()
    return {"tier": strategy.restored_tier(), "storage_bytes": counter.total}


def train_with_harness_loop(workload: Workload, strategy: CheckpointStrategy, observer: HarnessObserver,
                            emergency: Any) -> None:
    """The harness's own loop: ``train_step`` per step, ``strategy.save`` at checkpoint steps, the
    SIGTERM emergency save between steps (``emergency``: an `EmergencySave`, or None)."""
    clock = observer.clock
    trained = workload.inner if workload.inner is not None else workload
    trained.micro_step_listener = observer.between_micro_steps

    def emergency_save() -> None:
        clock.phase = ClockPhase.EMERGENCY
        strategy.save(workload, workload.step)
        clock.phase = ClockPhase.IDLE

    while workload.step < observer.steps:
        if emergency is not None and emergency.requested():  # between steps, agreed by every rank
            emergency.stop(workload.step, None if observer.saved_step == workload.step else emergency_save)
        step = workload.step + 1
        observer.before_step(step)
        loss = workload.train_step()
        observer.after_step(workload, step, loss)
        if step % observer.checkpoint_every:
            continue
        if observer.snapshot_due(step):
            workload.save_reference_snapshot(observer.snapshot_path(step))
        if observer.saves:
            observer.before_save(step)
            strategy.save(workload, step)
            observer.after_save(step)
    if observer.saves:
        strategy.finish(workload)
