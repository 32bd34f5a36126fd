"""The oracle of black-box mode: a verdict from what a user's script logged (`contract`), compared
bitwise with an uninterrupted run of the same script. Same `Verdict` as the harness's oracle; the
script's state is not visible, so its losses are the whole evidence.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.records import RankError
from ..core.records import Divergence, Verdict
from .judge import worst


@dataclass(frozen=True)
class RankLog:
    """What one rank of one incarnation logged, from its event file."""

    rank: int
    losses: dict[int, float]
    saved: tuple[int, ...]
    restored: tuple[int, ...]
    errors: tuple[dict, ...]  # its uncaught exceptions
    fault_events: tuple[dict, ...]

    @classmethod
    def from_events(cls, rank: int, events: list[dict]) -> RankLog:
        return cls(rank=rank, losses={e["step"]: e["loss"] for e in events if e["event"] == "loss"},
                   saved=tuple(e["step"] for e in events if e["event"] == "save_returned"),
                   restored=tuple(e["step"] for e in events if e["event"] == "restored"),
                   errors=tuple(e for e in events if e["event"] == "error"),
                   fault_events=tuple(e for e in events if e["event"] == "fault_fired"))


def judge_logs(reference: dict[int, float], first_run: list[RankLog], restart: list[RankLog] | None,
               hung: str | None) -> Verdict:
    """``reference``: the uninterrupted run's loss per step; ``first_run`` and ``restart``: one log per
    rank (``restart`` None when the job never restarted); ``hung``: the part past its deadline."""
    silent, notes = [], []
    divergence = None
    final_step = max(reference, default=0)

    for log in first_run:
        found = _mismatch(log.losses, reference, "first_run", log.rank)
        if found:
            divergence = divergence or found
            silent.append(f"first run: rank {log.rank} loss at step {found.step} is {found.got!r}, "
                          f"the reference has {found.expected!r}")
            break
    saved_everywhere = set.intersection(*(set(log.saved) for log in first_run)) if first_run else set()
    complete = max(saved_everywhere, default=0)

    restored_step = None
    if restart:
        restored = {log.rank: log.restored[0] for log in restart if log.restored}
        restored_step = restored.get(0)
        if len(set(restored.values())) > 1:
            silent.append(f"ranks restored different steps: {restored}")
        if restored_step is not None and restored_step < complete:
            silent.append(f"lost checkpoint: restored step {restored_step}, but the step-{complete} save "
                          f"had been logged as saved on every rank before the fault")
        if restored_step is not None and restored_step > complete:
            notes.append(f"restored step {restored_step}, newer than the last save logged on every rank "
                         f"({complete}); accepted only because the losses after it match")
        for log in restart:
            after = {s: v for s, v in log.losses.items() if restored_step is not None and s > restored_step}
            found = _mismatch(after, reference, "restart", log.rank)
            if found:
                divergence = divergence or found
                silent.append(f"after restore: rank {log.rank} loss at step {found.step} is {found.got!r}, "
                              f"the uninterrupted run has {found.expected!r}")
                break

    first_error = _first_error(first_run, "first_run") or _first_error(restart or [], "restart")
    if restart and not first_error and not hung:
        reached = min((max(log.losses, default=restored_step or 0) for log in restart), default=0)
        if reached < final_step:
            silent.append(f"the restarted job ended at step {reached} without an error; "
                          f"the uninterrupted run reached step {final_step}")
    if restart is None and not (silent or hung or first_error):
        silent.append("the job never restarted, so no restore was tested")
    kind = worst(silent, hung, first_error)
    findings = silent + ([f"{hung} passed its deadline"] if hung else []) \
        + ([f"rank {first_error.rank} failed in {first_error.phase}: {first_error.summary()}"] if first_error else []) \
        + notes
    return Verdict(kind=kind, findings=tuple(findings), first_error=first_error, restored_step=restored_step,
                   complete_step=complete, divergence=divergence, hung_phase=hung)


def _first_error(logs: list[RankLog], phase: str) -> RankError | None:
    """The earliest uncaught exception, unless an injected kill came first (then peers' errors are
    its consequences)."""
    kills = [e["time"] for log in logs for e in log.fault_events if e.get("ends_process")]
    errors = sorted((e for log in logs for e in log.errors), key=lambda e: e["time"])
    if not errors or (kills and min(kills) <= errors[0]["time"]):
        return None
    e = errors[0]
    return RankError(e["rank"], phase, e["type"], e["message"], e.get("traceback", ""), e["time"],
                     tuple(e.get("chain", ())))


def _mismatch(got: dict[int, float], expected: dict[int, float], phase: str, rank: int) -> Divergence | None:
    for step in sorted(got):
        if got[step] != expected.get(step):
            return Divergence(phase=phase, rank=rank, step=step, expected=expected.get(step), got=got[step])
    return None
