"""What a timeline cost, launch by launch: the steps each restore had to train again, the seconds
spent getting back, and the goodput of the whole job. Reported, never asserted (timing is noise on
a shared machine)."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.events import Event
from ..core.plan import FIRST_RUN, REFERENCE, launch_name
from ..core.records import CaseResult, PhaseResult


@dataclass(frozen=True)
class LaunchLoss:
    """One launch after the first: what it restored, and what the launch before it had trained past."""
    launch: str
    restored_step: int | None
    steps_lost: int | None  # None: nothing restored
    restart_s: float | None  # first rank joined to last rank restored
    replay_s: float | None  # from there to the last loss at the step the launch before had reached


@dataclass(frozen=True)
class TimelineCost:
    losses: tuple[LaunchLoss, ...]
    goodput: float | None  # the reference's training time over the launches' summed (None: untimed)

    @property
    def steps_lost(self) -> int:
        return sum(loss.steps_lost or 0 for loss in self.losses)

    @property
    def seconds_lost(self) -> float:
        return sum((loss.restart_s or 0.0) + (loss.replay_s or 0.0) for loss in self.losses)


def launches(result: CaseResult) -> list[PhaseResult]:
    """The first run and every launch after it, in order (no reference, continuation or probe)."""
    names = [FIRST_RUN, *(launch_name(index) for index in range(1, len(result.case.incarnations) + 1))]
    found = [result.phase(name) for name in names]
    return [phase for phase in found if phase is not None]


def last_trained(phase: PhaseResult) -> int:
    return max((e["step"] for e in phase.events(Event.LOSS)), default=0)


def training_s(phase: PhaseResult) -> float | None:
    """First rank joined to the last loss any rank logged (start-up and restore included)."""
    joined = [e["time"] for e in phase.events(Event.JOINED)]
    losses = [e["time"] for e in phase.events(Event.LOSS)]
    return max(losses) - min(joined) if joined and losses else None


def launch_loss(before: PhaseResult, phase: PhaseResult) -> LaunchLoss:
    restored = phase.restored()
    step = restored[0]["step"] if 0 in restored else None
    if step is None:
        return LaunchLoss(phase.name, None, None, None, None)
    back_at = max(last_trained(before), step)
    restart_s, replay_s = phase.restore_seconds(step, back_at) or (None, None)
    return LaunchLoss(phase.name, step, back_at - step, restart_s, replay_s)


def timeline_cost(result: CaseResult) -> TimelineCost:
    runs = launches(result)
    losses = tuple(launch_loss(before, after) for before, after in zip(runs, runs[1:], strict=False))
    reference = result.phase(REFERENCE)
    spent = [training_s(run) for run in runs]
    expected = training_s(reference) if reference is not None else None
    goodput = expected / sum(spent) if expected and None not in spent and sum(spent) > 0 else None
    return TimelineCost(losses=losses, goodput=goodput)


def render(result: CaseResult) -> list[str]:
    """The text report's lines for a case with a timeline (none for a single restart)."""
    if not result.case.timeline:
        return []
    cost = timeline_cost(result)
    faults = [result.case.fault, *(launch.fault for launch in result.case.incarnations)]
    lines = ["schedule: " + "; ".join(f"launch {number}: {fault.kind} rank {fault.trigger.rank} at step "
                                      f"{fault.trigger.step} ({fault.trigger.phase})"
                                      for number, fault in enumerate(faults, 1) if fault.trigger is not None)]
    lines += [f"launch {number} ({loss.launch}): restored step {loss.restored_step}, "
             + (f"{loss.steps_lost} steps trained again" if loss.steps_lost is not None else "nothing restored")
             + (f", {loss.restart_s + loss.replay_s:.2f} s" if loss.restart_s is not None else "")
             for number, loss in enumerate(cost.losses, 2)]
    lines.append(f"work lost over {len(cost.losses)} restarts: {cost.steps_lost} steps, {cost.seconds_lost:.2f} s"
                 + (f"; goodput {cost.goodput:.2f} (the reference's training time over the launches')"
                    if cost.goodput is not None else ""))
    return lines
