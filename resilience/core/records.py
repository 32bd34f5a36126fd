"""The records passed between layers once ranks have run: what each rank left behind, what a
phase and a case produced, and the verdict the oracle gave. Frozen, so no layer edits another's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .case import Case, VerdictKind
from .events import Event
from .wire import WireName


@dataclass(frozen=True)
class RankError:
    """The evidence of a LOUD verdict: who failed, where, with what."""

    rank: int
    phase: str
    type: str
    message: str
    traceback: str
    time: float
    chain: tuple[str, ...] = ()  # 'Type: message' of the exceptions it was raised from

    def summary(self) -> str:
        head = f"{self.type}: {self.message}"
        return head + "".join(f" (from {link})" for link in self.chain)


@dataclass(frozen=True)
class RankRecord:
    rank: int
    returncode: int | None
    events: tuple[dict, ...]
    stdout_tail: str
    stderr_tail: str


class PhaseStatus(WireName):
    """How a phase (or any supervised group of processes) ended: a str, so a record is plain JSON."""

    COMPLETED = "completed"  # every member exited 0
    FAILED = "failed"  # a member failed (exited non-zero, or raised)
    FAULT_KILLED = "fault_killed"  # failed, the first failure being the injected kill
    DEADLINE = "deadline"  # the phase's deadline passed with members still running
    NOT_STARTED = "not_started"  # never launched (the launch before it hung, or its launcher gave up)


@dataclass(frozen=True)
class PhaseResult:
    name: str
    world_size: int
    status: PhaseStatus
    ranks: tuple[RankRecord, ...]
    first_error: RankError | None
    fault_events: tuple[dict, ...]
    elapsed_s: float
    hang_summary: tuple[str, ...] = ()  # at a deadline: where each rank was waiting

    def events(self, kind: str) -> list[dict]:
        return [e for record in self.ranks for e in record.events if e["event"] == kind]

    def every_rank_joined(self) -> bool:
        """Whether the phase's group formed: every rank reported ``joined``."""
        return len({e["rank"] for e in self.events(Event.JOINED)}) >= self.world_size

    def losses(self, rank: int) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.ranks[rank].events if e["event"] == Event.LOSS}

    def restored(self) -> dict[int, dict]:
        return {e["rank"]: e for e in self.events(Event.RESTORED)}

    def complete_saves(self) -> list[int]:
        """The steps whose save returned on every rank of this phase, oldest first."""
        saved: dict[int, set[int]] = {}
        for event in self.events(Event.SAVE_RETURNED):
            saved.setdefault(event["step"], set()).add(event["rank"])
        return sorted(step for step, ranks in saved.items() if len(ranks) == self.world_size)

    def restore_seconds(self, restored_step: int, back_at: int) -> tuple[float, float] | None:
        """(restart, replay) of this restoring phase: from the first rank joining the group to the
        last rank restored, then to the last rank's loss at step ``back_at`` (or its last loss
        short of it); None where it never restored."""
        joined = [e["time"] for e in self.events(Event.JOINED)]
        restored = [e["time"] for e in self.events(Event.RESTORED)]
        if not joined or not restored:
            return None
        replayed = [e["time"] for e in self.events(Event.LOSS) if restored_step < e["step"] <= back_at]
        return max(restored) - min(joined), max(replayed, default=max(restored)) - max(restored)


@dataclass(frozen=True)
class Divergence:
    phase: str
    rank: int
    step: int
    expected: float | None
    got: float | None


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    findings: tuple[str, ...]  # why, in the order found
    first_error: RankError | None
    restored_step: int | None
    complete_step: int  # newest checkpoint whose save had returned on every rank before the fault
    divergence: Divergence | None = None
    hung_phase: str | None = None
    state_diff: tuple[str, ...] = field(default=())
    intact_step: int | None = None  # LOUD at restore, yet this older checkpoint restored and verified


@dataclass(frozen=True)
class CaseResult:
    case: Case
    verdict: Verdict
    phases: tuple[PhaseResult, ...]
    work_dir: Path
    #: the verdict is that of a sampled search (a power-loss save too large to enumerate): which
    #: state it found, and so the restored step, may differ between runs; the verdict may too
    sampled: bool = False

    @property
    def fault_fired(self) -> bool:
        return any(phase.fault_events for phase in self.phases)

    @property
    def fault_acted(self) -> bool:
        """It fired, and not only to stop the first run for a restart where it then never acted."""
        return any(e.get("action") != "stop" for phase in self.phases for e in phase.fault_events)

    def fault_missed(self) -> str:
        """Why the fault found nothing to act on, as a rank said it (``fault_missed``), or ""."""
        return next((e.get("reason", "") for p in self.phases for r in p.ranks for e in r.events
                     if e["event"] == Event.FAULT_MISSED), "")

    # -- figures a qualification report shows (derived from the phases' events) ----------------
    def phase(self, name: str) -> PhaseResult | None:
        return next((p for p in self.phases if p.name == name), None)

    def loss_series(self, name: str) -> dict[int, float]:
        """Loss per step in phase ``name``, from whichever ranks reported it (a killed rank stops early)."""
        found = self.phase(name)
        series: dict[int, float] = {}
        for record in found.ranks if found else ():
            for event in record.events:
                if event["event"] == Event.LOSS:
                    series.setdefault(event["step"], event["loss"])
        return dict(sorted(series.items()))

    @property
    def steps_lost(self) -> int | None:
        """Steps the first run had trained that the restart had to train again (None: no restore)."""
        restored, trained = self.verdict.restored_step, self.loss_series("first_run")
        return None if restored is None else max(0, max(trained, default=0) - restored)

    @property
    def lost_s(self) -> tuple[float, float] | None:
        """Seconds the restart spent before it was back where the first run had got, as (restart,
        replay): restart from the first rank joining the group to the last rank restored (start-up
        of the group and ``strategy.load``), replay from there to the last rank's loss at the first
        run's last trained step. None: nothing restored. A replay the restart never finished counts
        up to its last loss."""
        restart = self.phase("restart")
        if restart is None or self.verdict.restored_step is None:
            return None
        return restart.restore_seconds(self.verdict.restored_step, self.verdict.restored_step + (self.steps_lost or 0))

    @property
    def restore_s(self) -> float | None:
        """Wall time of the restart's ``strategy.load``: its slowest rank."""
        restart = self.phase("restart")
        times = [e["load_s"] for e in restart.events(Event.RESTORED) if "load_s" in e] if restart else []
        return max(times) if times else None

    @property
    def restored_from(self) -> str | None:
        """The tier the restart's ranks restored from, for a strategy with several (``RESTORE_TIERS``):
        "memory" or "storage", each rank's where they differ ("0: memory, 1: storage"); None otherwise."""
        restart = self.phase("restart")
        tiers = {e["rank"]: e["tier"] or "nothing" for e in restart.events(Event.RESTORED) if "tier" in e} \
            if restart else {}
        if not tiers:
            return None
        if len(set(tiers.values())) == 1:
            return next(iter(tiers.values()))
        return ", ".join(f"{rank}: {tier}" for rank, tier in sorted(tiers.items()))

    @property
    def storage_bytes_read(self) -> int | None:
        """Bytes the restart's ranks read under the checkpoint directory while restoring, summed, for a
        strategy with several tiers (0 where the memory served every rank); None otherwise."""
        restart = self.phase("restart")
        counts = [e["storage_bytes"] for e in restart.events(Event.RESTORED) if "storage_bytes" in e] \
            if restart else []
        return sum(counts) if counts else None

    @property
    def save_s(self) -> dict[int, float]:
        """Per checkpoint step saved on every rank: first ``save_begin`` to last ``save_returned``."""
        first_run = self.phase("first_run")
        if first_run is None:
            return {}
        begun: dict[int, list[float]] = {}
        returned: dict[int, list[float]] = {}
        for event in first_run.events(Event.SAVE_BEGIN):
            begun.setdefault(event["step"], []).append(event["time"])
        for event in first_run.events(Event.SAVE_RETURNED):
            returned.setdefault(event["step"], []).append(event["time"])
        return {step: max(returned[step]) - min(begun[step]) for step in sorted(returned)
                if len(returned[step]) == first_run.world_size and step in begun}
