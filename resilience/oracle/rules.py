"""The verdict rules, once: the harness's oracle (`judge`) and black-box mode's (`blackbox`)
apply these to what each can see (the harness: state fingerprints and losses; a user's script:
its logged losses). Worst finding wins: SILENT > HANG > LOUD > RECOVERED.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from ..core.case import VerdictKind
from ..core.events import Event
from ..core.records import Divergence, PhaseResult, RankError


def loss_mismatch(got: Mapping[int, float], expected: Mapping[int, float], phase: str, rank: int) -> Divergence | None:
    """The first step whose loss is not bitwise the expected one."""
    for step in sorted(got):
        if got[step] != expected.get(step):
            return Divergence(phase=phase, rank=rank, step=step, expected=expected.get(step), got=got[step])
    return None


def first_run_divergence(losses: Mapping[int, Mapping[int, float]], reference: Mapping[int, float]
                         ) -> tuple[Divergence | None, list[str]]:
    """The first run must follow the reference until it stops: a save must not disturb training.
    ``losses``: rank -> step -> loss."""
    for rank in sorted(losses):
        found = loss_mismatch(losses[rank], reference, "first_run", rank)
        if found:
            return found, [f"first run: rank {rank} loss at step {found.step} is {found.got!r}, "
                           f"the reference has {found.expected!r}"]
    return None, []


def newest_complete_save(saved: Mapping[int, set[int]], world_size: int) -> int:
    """The newest step whose save returned on every rank before the fault (0: none).
    ``saved``: step -> ranks on which that save returned."""
    return max((step for step, ranks in saved.items() if len(ranks) == world_size), default=0)


def restore_findings(restored: Mapping[int, int], complete: int, fallback_ok: bool, newer_accepted_because: str,
                     ended: bool = False, logged: RankError | None = None) -> tuple[list[str], list[str]]:
    """What the restored steps alone say: (SILENT findings, notes). ``restored``: rank -> step;
    rank 0's step is the one judged; ``ended``: the launch that saved ``complete`` ran to its end;
    ``logged``: an error that launch's log reported (`logged_error`): then a lost last save was
    said, and is LOUD (the caller's evidence), not SILENT."""
    silent, notes = [], []
    if len(set(restored.values())) > 1:
        silent.append(f"ranks restored different steps: {dict(sorted(restored.items()))}")
    step = restored.get(0)
    if step is not None and step < complete and ended and logged is not None:
        notes.append(f"lost checkpoint: restored step {step}; the job ended, every rank exiting 0, with step "
                     f"{complete} returned as saved, but rank {logged.rank}'s log said it failed: {logged.message}")
    elif step is not None and step < complete and not fallback_ok:
        silent.append(f"lost checkpoint: restored step {step}, but the job ended, every rank exiting 0, believing "
                      f"step {complete} saved (its save had returned on every rank)" if ended else
                      f"lost checkpoint: restored step {step}, but the step-{complete} save had returned on every "
                      f"rank before the fault")
    if step is not None and step > complete:
        notes.append(f"restored step {step}, newer than the last save confirmed on every rank ({complete}); "
                     f"accepted only because {newer_accepted_because}")
    return silent, notes


def tier_findings(restored: Mapping[int, Mapping]) -> list[str]:
    """A restore from several tiers (``RESTORE_TIERS``: memory and storage) must take every rank's
    state from one tier: a mix means the ranks disagreed on what survived, SILENT even where each
    rank's own state is a valid checkpoint. ``restored``: rank -> its ``restored`` event."""
    tiers = {rank: event["tier"] for rank, event in restored.items() if event.get("tier")}  # None: nothing restored
    if len(set(tiers.values())) < 2:
        return []
    return [f"ranks restored from different tiers: {dict(sorted(tiers.items()))} (every rank must restore "
            "the same step from the same tier)"]


# An error-level record in a log: logging's ERROR or CRITICAL level name (or FATAL) standing as a
# word, or an uncaught exception's traceback (a thread's too). A warning that goes on is not one:
# a job that logs "warning: ... failed, continuing" has said the failure does not matter.
_ERROR_RECORD = re.compile(r"(?:^|[\s\[|:-])(?:ERROR|CRITICAL|FATAL)(?:[\s\]|:-]|$)")
_RAISED_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout)\b.*")


def logged_error(phase: PhaseResult) -> RankError | None:
    """The first error-level record in the stderr of ``phase``'s ranks (`_ERROR_RECORD`, or a
    traceback's last ``Type: message`` line), as evidence of a failure the job reported only in
    its log; None when no rank logged one."""
    for record in phase.ranks:
        lines = record.stderr_tail.splitlines()
        for index, line in enumerate(lines):
            if line.startswith("Traceback (most recent call last):") or line.startswith("Exception in thread"):
                raised = next((later.strip() for later in lines[index + 1:] if _RAISED_LINE.match(later)),
                              line.strip())
                return RankError(record.rank, phase.name, "LoggedError", raised, record.stderr_tail, 0.0)
            if _ERROR_RECORD.search(line):
                return RankError(record.rank, phase.name, "LoggedError", line.strip(), record.stderr_tail, 0.0)
    return None


def differing_entries(expected: Mapping[str, str], got: Mapping[str, str]) -> list[str]:
    """The state entries whose digests differ between two fingerprints (or exist in one only)."""
    return sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))


def after_restore_divergence(losses: Mapping[int, Mapping[int, float]], expected: Mapping[int, float],
                             restored_step: int, phase: str) -> tuple[Divergence | None, list[str]]:
    """After the restore every loss must equal the oracle's bitwise. ``losses``: rank -> step -> loss."""
    for rank in sorted(losses):
        after = {s: v for s, v in losses[rank].items() if s > restored_step}
        found = loss_mismatch(after, expected, phase, rank)
        if found:
            return found, [f"after restore: rank {rank} loss at step {found.step} is {found.got!r}, "
                           f"the reference continuation has {found.expected!r}"]
    return None, []


def intact_notes(intact_step: int | None) -> list[str]:
    """Availability inside LOUD: the restore refused, yet the step-``intact_step`` checkpoint
    restored alone by the strategy (its ``load_step``, or its library's resume from that one
    checkpoint) in fresh ranks and verified bitwise."""
    if intact_step is None:
        return []
    return [f"refused; step {intact_step} was intact and never tried (restored alone by the strategy in "
            f"fresh ranks: state and every later loss equal to the reference bitwise)"]


#: how bad each verdict is, as `worst` orders them
SEVERITY = {VerdictKind.RECOVERED: 0, VerdictKind.LOUD: 1, VerdictKind.HANG: 2, VerdictKind.SILENT: 3}


def worst(silent: list[str], hung: str | None, first_error: RankError | None) -> VerdictKind:
    """The verdict the findings add up to: SILENT > HANG > LOUD > RECOVERED."""
    if silent:
        return VerdictKind.SILENT
    if hung:
        return VerdictKind.HANG
    if first_error:
        return VerdictKind.LOUD
    return VerdictKind.RECOVERED


def findings(silent: list[str], hang_lines: list[str], first_error: RankError | None,
             notes: list[str]) -> tuple[str, ...]:
    """Every finding in the order a reader needs them: what went silently wrong, where it hung, who
    failed first, then notes."""
    failed = [f"rank {first_error.rank} failed in {first_error.phase}: {first_error.summary()}"] if first_error else []
    return tuple(silent + hang_lines + failed + notes)


def foreign_reads(restart: PhaseResult) -> list[str]:
    """The files the restart's ranks opened under the first run's phase directory (its working
    directory, logs, anything it wrote beside the checkpoint): SILENT, since a restart on a fresh
    node, or after that directory is gone, could not have read them."""
    by_path: dict[str, list[int]] = {}
    for event in restart.events(Event.FOREIGN_READ):
        by_path.setdefault(event["path"], []).append(event["rank"])
    return [f"{restart.name}: rank {', '.join(map(str, sorted(set(ranks))))} read {path}, which the first run wrote "
            "outside the checkpoint directory: the checkpoint is not self-contained"
            for path, ranks in sorted(by_path.items())]
