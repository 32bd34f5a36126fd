"""The oracle of black-box mode: a verdict on a user's unmodified script, each rank against the same
rank of an uninterrupted run of the same script, bitwise. Same `Verdict` and rules as the
harness's oracle.

The evidence is what the rank hook saw (`rank.step_observer`): per step the loss and a digest of
the state before it, and the files written under the checkpoint directory; or, where the script
prints them, the log contract's lines (`core.log_contract`), which take precedence. The restored
step of a restart is the reference step whose parameters digest the same as the restart's first
step; the other parts of the digest (optimizer state, RNG streams) then say what else came back.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..core.case import VerdictKind
from ..core.events import ClockPhase, Event
from ..core.records import RankError, Verdict
from . import rules
from .envelope import Envelope
from .evidence import earliest_unless_killed, error_from_event

#: digest parts compared after the parameters matched, in the words of a finding
STATE_PARTS = {"optimizer": "the optimizer state", "torch_rng": "torch's RNG stream",
               "python_rng": "Python's random stream", "numpy_rng": "NumPy's RNG stream"}
#: a stream that never moved in the reference is one the script does not use (Python's and NumPy's
#: are seeded afresh in each process): its value says nothing
RNG_PARTS = ("torch_rng", "python_rng", "numpy_rng")


@dataclass(frozen=True)
class RankLog:
    """What one rank of one incarnation did, from its event file. ``losses``, ``saved`` and
    ``restored`` come from contract lines; ``observed``, ``digests`` and ``written`` from the hooks."""

    rank: int
    losses: dict[int, float]
    saved: tuple[int, ...]
    restored: tuple[int, ...]
    errors: tuple[dict, ...]  # its uncaught exceptions
    fault_events: tuple[dict, ...]
    observed: dict[int, float] = field(default_factory=dict)  # hook step (1, 2, ...) -> loss
    digests: dict[int, dict[str, str]] = field(default_factory=dict)  # hook step -> part -> digest
    written: tuple[tuple[str, int, str], ...] = ()  # (file, clock step, clock phase) as each was closed
    after: dict[int, dict[str, str]] = field(default_factory=dict)  # hook step -> its state once stepped
    read: tuple[str, ...] = ()  # files a restarted rank opened for reading before its first backward
    state_at_exit: dict[str, str] | None = None  # a rank that trained no step: the state it loaded

    @classmethod
    def from_events(cls, rank: int, events: list[dict]) -> RankLog:
        observed = [e for e in events if e["event"] == Event.OBSERVED_STEP]
        return cls(rank=rank, losses={e["step"]: e["loss"] for e in events if e["event"] == Event.LOSS},
                   saved=tuple(e["step"] for e in events if e["event"] == Event.SAVE_RETURNED),
                   restored=tuple(e["step"] for e in events if e["event"] == Event.RESTORED),
                   errors=tuple(e for e in events if e["event"] == Event.ERROR),
                   fault_events=tuple(e for e in events if e["event"] == Event.FAULT_FIRED),
                   observed={e["step"]: e["loss"] for e in observed},
                   digests={e["step"]: e["digest"] for e in observed},
                   written=tuple((e["file"], e["step"], e["phase"]) for e in events
                                 if e["event"] == Event.FILE_WRITTEN),
                   after={e["step"]: e["digest"] for e in events if e["event"] == Event.STEP_DONE},
                   read=tuple(e["file"] for e in events if e["event"] == Event.FILE_READ),
                   state_at_exit=next((e["digest"] for e in events if e["event"] == Event.STATE_AT_EXIT), None))

    @property
    def uses_contract(self) -> bool:
        return bool(self.losses)

    def step_losses(self, restored: int = 0) -> dict[int, float]:
        """Loss per step of the run: the contract's steps, or the hooks' counted from ``restored``."""
        if self.uses_contract:
            return self.losses
        return {restored + step: loss for step, loss in self.observed.items()}

    def shifted(self, restored: int) -> RankLog:
        """This log with the hooks' steps counted from ``restored`` as the first run's are (a later
        launch's hooks count its own steps from 1); contract lines name their steps already."""
        if self.uses_contract or not restored:
            return self
        return replace(self, observed={restored + step: loss for step, loss in self.observed.items()},
                       digests={restored + step: digest for step, digest in self.digests.items()},
                       after={restored + step: digest for step, digest in self.after.items()},
                       saved=tuple(restored + step for step in self.saved),
                       written=tuple((file, restored + step, phase) for file, step, phase in self.written))

    def saved_states(self) -> dict[int, dict[str, str]]:
        """The state a checkpoint of each step holds (0: the initial one, before the first step)."""
        states = dict(self.after)
        if 1 in self.digests:
            states[0] = self.digests[1]
        return states


@dataclass(frozen=True)
class Restore:
    """The step each rank of the restart came back at, and what the digests say beyond it."""

    steps: dict[int, int]
    silent: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def restored_steps(reference: list[RankLog], first_run: list[RankLog], restart: list[RankLog],
                   rng_known: bool = True) -> Restore:
    """The contract's ``restored`` lines, or per restarted rank the step whose saved state (the
    first run's, which wrote the checkpoints, then the reference's) holds the parameters the rank
    had before its first step; 0 for the initial parameters. ``rng_known``: the reference's RNG
    states are those of the job (a bitwise-reproducible script)."""
    if any(log.restored for log in restart):
        return Restore({log.rank: log.restored[0] for log in restart if log.restored})
    steps, silent, notes = {}, [], []
    for log in restart:
        first = log.digests.get(min(log.digests, default=0), log.state_at_exit)
        if first is None or log.rank >= len(reference):
            continue
        ours = next((other for other in first_run if other.rank == log.rank), None)
        saved = {**reference[log.rank].saved_states(), **(ours.saved_states() if ours else {})}
        matches = [step for step, state in sorted(saved.items()) if state["parameters"] == first["parameters"]]
        if not matches:
            silent.append(f"rank {log.rank} trained on after the restart from parameters that match no step of "
                          "the run that saved them")
            continue
        step = next((s for s in reversed(matches) if saved[s]["optimizer"] == first["optimizer"]), matches[-1])
        steps[log.rank] = step
        missing = []
        if saved[step]["optimizer"] != first["optimizer"]:
            missing.append(f"{STATE_PARTS['optimizer']} ({_matching_step(saved, 'optimizer', first['optimizer'])})")
        if rng_known:
            before = {s - 1: digest for s, digest in reference[log.rank].digests.items()}  # after the batch draw
            used = [part for part in RNG_PARTS if len({digest.get(part) for digest in before.values()}) > 1]
            missing += [f"{STATE_PARTS[part]} ({_matching_step(before, part, first[part])})" for part in used
                        if part in first and step in before and before[step].get(part) != first[part]]
        if missing:
            notes.append(f"rank {log.rank}: parameters restored at step {step}; not restored: " + ", ".join(missing))
    return Restore(steps, tuple(silent), tuple(notes))


def _matching_step(states: dict[int, dict[str, str]], part: str, value: str) -> str:
    steps = [step for step, digest in sorted(states.items()) if digest.get(part) == value]
    return f"it is the one of step {steps[0]}" if steps else "it matches no step"


def judge_logs(reference: list[RankLog], first_run: list[RankLog], restart: list[RankLog] | None,
               hung: str | None, envelope: Envelope | None = None, fallback_ok: bool = False,
               rescaled: str | None = None, reads_from_run: bool = True,
               continuation: list[RankLog] | None = None, to_the_end: bool = True) -> Verdict:
    """``reference``: the uninterrupted run, one log per rank; ``first_run`` and ``restart``: one
    log per rank (``restart`` None when the job never restarted); ``hung``: the part past its
    deadline. Each rank is judged against its own reference, bitwise, or within ``envelope``
    (a script that is not reproducible). ``fallback_ok``: an older checkpoint than the newest
    complete one may be restored (the intact-checkpoint probe hid the newest). ``rescaled``: the
    restart ran at another world size, said in these words; its losses are not compared, unless
    ``continuation`` (one log per rank at the restart's size, resumed from an uninterrupted run's
    save of the step the restart restored) gives them their oracle.
    ``reads_from_run``: the files the restart read hold what the first run last wrote (not so in
    a rebuilt crash state), so their saves are cross-checked with the restored step. ``to_the_end``
    False: a launch of a timeline that its own fault ends, which need not reach the last step."""
    expected = {log.rank: log.step_losses() for log in reference}
    final_step = max((max(losses, default=0) for losses in expected.values()), default=0)
    divergence, silent = None, []
    for log in first_run:
        if envelope is not None:
            found, lines = envelope.miss(log.rank, log.step_losses(), "first_run")
        else:
            found, lines = rules.first_run_divergence({log.rank: log.step_losses()}, expected.get(log.rank, {}))
        divergence, silent = divergence or found, silent + lines
    writers = {log.rank for log in reference if log.written or log.saved} or {log.rank for log in first_run}
    saved: dict[int, set[int]] = {}
    for log in first_run:
        if log.rank in writers:
            for step in log.saved:  # the contract's lines, or the hook's (see RankPlace)
                saved.setdefault(step, set()).add(log.rank)
    complete = rules.newest_complete_save(saved, len(writers))

    restored_step, notes = None, []
    idle_restart = restart and not any(log.step_losses() for log in restart)
    if restart:
        restore = restored_steps(reference, first_run, restart, rng_known=envelope is None)
        silent += restore.silent
        notes += restore.notes
        restored_step = restore.steps.get(0)
        losses_compared = not idle_restart and (not rescaled or continuation is not None)
        found, more = rules.restore_findings(
            restore.steps, complete, fallback_ok, "the losses after it match" if losses_compared else
            "its parameter and optimizer digests are that step's" + (", the run's last" if idle_restart else ""))
        silent += found
        notes += more
        notes += [rescaled] if rescaled else []
        notes += read_notes(first_run, restart, restored_step if reads_from_run else None)
        oracle = expected if continuation is None else \
            {log.rank: log.step_losses(restored_step or 0) for log in continuation}
        for log in restart:
            if log.rank not in restore.steps or (rescaled and continuation is None):
                continue
            step, losses = restore.steps[log.rank], log.step_losses(restore.steps[log.rank])
            if envelope is not None and continuation is None:
                after, lines = envelope.miss(log.rank, losses, "restart", step)
            else:
                after, lines = rules.after_restore_divergence({log.rank: losses}, oracle.get(log.rank, {}), step,
                                                              "restart")
            divergence, silent = divergence or after, silent + lines

    first_error = _first_error(first_run, "first_run") or _first_error(restart or [], "restart")
    if idle_restart and final_step in (complete, restored_step) and not first_error and not hung:
        notes.append(f"the restart trained no step: the step-{final_step} checkpoint was the run's last, so there "
                     "was nothing left to compare after its restore")
    elif restart and not first_error and not hung and to_the_end:
        reached = min((max(log.step_losses(restored_step or 0), default=restored_step or 0) for log in restart),
                      default=0)
        if reached < final_step:
            silent.append(f"the restarted job ended at step {reached} without an error; "
                          f"the uninterrupted run reached step {final_step}")
    if restart is None and not (silent or hung or first_error):
        silent.append("the job never restarted, so no restore was tested")
    if envelope is not None:
        notes.append(envelope.describe())
    kind = rules.worst(silent, hung, first_error)
    if kind in (VerdictKind.LOUD, VerdictKind.SILENT):
        notes += overwritten_notes(first_run, complete)
    return Verdict(kind=kind,
                   findings=rules.findings(silent, [f"{hung} passed its deadline"] if hung else [], first_error, notes),
                   first_error=first_error, restored_step=restored_step, complete_step=complete,
                   divergence=divergence, hung_phase=hung)


def overwritten_notes(first_run: list[RankLog], complete: int) -> list[str]:
    """The newest complete checkpoint's files that a later save of the first run wrote again (a
    save in place: nothing intact was left to fall back to)."""
    kept = {(log.rank, file) for log in first_run for file, step, phase in log.written
            if phase == ClockPhase.SAVE and step == complete}
    later = sorted({(step, file) for log in first_run for file, step, phase in log.written
                    if phase == ClockPhase.SAVE and step > complete and (log.rank, file) in kept})
    if not complete or not later:
        return []
    files = ", ".join(sorted({file for _, file in later}))
    return [f"the newest complete checkpoint (step {complete}) was overwritten in place by the save of step "
            f"{later[0][0]} ({files}): it no longer existed when the job restarted"]


def read_notes(first_run: list[RankLog], restart: list[RankLog], restored: int | None) -> list[str]:
    """What the restart read before its first step, each file with the save that last wrote it in
    the first run; where those saves disagree with the restored step, said so."""
    if any(log.uses_contract for log in restart):
        return []
    last_save = {file: step for log in first_run for file, step, phase in log.written if phase == ClockPhase.SAVE}
    read = sorted({file for log in restart for file in log.read})
    if not read:
        return ["the restart read no checkpoint file through open() before its first step (memory-mapped "
                "reads, such as safetensors', are not seen)"]
    saves = {last_save[file] for file in read if file in last_save}
    named = ", ".join(f"{file} (step {last_save[file]})" if file in last_save else file for file in read[:8])
    notes = [f"read before its first step: {named}" + (f" and {len(read) - 8} more" if len(read) > 8 else "")]
    if restored is not None and saves and restored not in saves:
        notes.append(f"the restart's state is that of step {restored}, yet the files it read were last written by "
                     f"the save of step {', '.join(map(str, sorted(saves)))}")
    return notes


def _first_error(logs: list[RankLog], phase: str) -> RankError | None:
    """The earliest uncaught exception, by the same rule as the harness's (`evidence`)."""
    return earliest_unless_killed([error_from_event(e, phase) for log in logs for e in log.errors],
                                  [e for log in logs for e in log.fault_events])
