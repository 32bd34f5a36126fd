"""The oracle of black-box mode: a verdict from what a user's script logged (`core.log_contract`), compared
bitwise with an uninterrupted run of the same script. Same `Verdict` as the harness's oracle; the
script's state is not visible, so its losses are the whole evidence.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.records import RankError, Verdict
from . import rules
from .evidence import earliest_unless_killed, error_from_event


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
    final_step = max(reference, default=0)
    divergence, silent = rules.first_run_divergence({log.rank: log.losses for log in first_run}, reference)
    saved: dict[int, set[int]] = {}
    for log in first_run:
        for step in log.saved:
            saved.setdefault(step, set()).add(log.rank)
    complete = rules.newest_complete_save(saved, len(first_run))

    restored_step, notes = None, []
    if restart:
        restored = {log.rank: log.restored[0] for log in restart if log.restored}
        restored_step = restored.get(0)
        found, notes = rules.restore_findings(restored, complete, False, "the losses after it match")
        silent += found
        if restored_step is not None:
            after, found = rules.after_restore_divergence({log.rank: log.losses for log in restart}, reference,
                                                          restored_step, "restart")
            divergence = divergence or after
            silent += found

    first_error = _first_error(first_run, "first_run") or _first_error(restart or [], "restart")
    if restart and not first_error and not hung:
        reached = min((max(log.losses, default=restored_step or 0) for log in restart), default=0)
        if reached < final_step:
            silent.append(f"the restarted job ended at step {reached} without an error; "
                          f"the uninterrupted run reached step {final_step}")
    if restart is None and not (silent or hung or first_error):
        silent.append("the job never restarted, so no restore was tested")
    return Verdict(kind=rules.worst(silent, hung, first_error),
                   findings=rules.findings(silent, [f"{hung} passed its deadline"] if hung else [], first_error, notes),
                   first_error=first_error, restored_step=restored_step, complete_step=complete,
                   divergence=divergence, hung_phase=hung)


def _first_error(logs: list[RankLog], phase: str) -> RankError | None:
    """The earliest uncaught exception, by the same rule as the harness's (`evidence`)."""
    return earliest_unless_killed([error_from_event(e, phase) for log in logs for e in log.errors],
                                  [e for log in logs for e in log.fault_events])
