"""Availability inside LOUD for a script that has no ``load_step``: was an older checkpoint intact?

After a restart that refused (LOUD), the files the newest save of the first run wrote are moved
aside (exactly those, from the record of written files; directories they leave empty go too, as a
script that picks the newest ``step_N/`` by name would otherwise pick it again) and the script is
restarted once more, in fresh ranks, without a fault. If it then restores an older step and every
later loss equals the reference's (the same oracle), the verdict says that step was intact and
never tried (``Verdict.intact_step``). A file the older checkpoint shares with the newest (a save
in place) cannot be moved aside without losing both: then nothing is tried, and the verdict's
note on the overwritten checkpoint says why.
"""
from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

from ..core.case import VerdictKind
from ..core.events import ClockPhase
from ..core.plan import RESTART
from ..core.records import Verdict
from ..oracle.blackbox import RankLog, judge_logs
from ..oracle.envelope import Envelope


def newest_save_files(first_run: list[RankLog]) -> tuple[int, list[str]]:
    """The newest step the first run saved files in, and those of its files no older save wrote."""
    saves = [(step, file) for log in first_run for file, step, phase in log.written if phase == ClockPhase.SAVE]
    if not saves:
        return 0, []
    newest = max(step for step, _ in saves)
    older = {file for step, file in saves if step < newest}
    return newest, sorted({file for step, file in saves if step == newest} - older)


def probe_older_checkpoint(verdict: Verdict, reference: list[RankLog], first_run: list[RankLog],
                           checkpoint_dir: Path, aside_dir: Path,
                           restart_once_more: Callable[[], list[RankLog] | None],
                           envelope: Envelope | None = None) -> Verdict:
    """``restart_once_more()``: launch the restart again (no fault) and return its ranks' logs, or
    None when it did not start or hung. Returns the verdict with what the probe found."""
    if verdict.kind is not VerdictKind.LOUD or verdict.first_error is None or verdict.first_error.phase != RESTART:
        return verdict
    step, files = newest_save_files(first_run)
    if not files:
        return verdict
    for relative in files:
        source = checkpoint_dir / relative
        if source.exists():
            (aside_dir / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(source, aside_dir / relative)
            _remove_empty_parents(source.parent, checkpoint_dir)
    logs = restart_once_more()
    probed = judge_logs(reference, first_run, logs, None, envelope, fallback_ok=True) if logs is not None else None
    if probed is not None and probed.kind is VerdictKind.RECOVERED and probed.restored_step is not None \
            and probed.restored_step < step:
        note = (f"refused; step {probed.restored_step} was intact and never tried (with the {len(files)} file(s) "
                f"the step-{step} save wrote moved aside, a fresh restart restored it and every later loss equals "
                "the reference's)")
        return dataclasses.replace(verdict, findings=verdict.findings + (note,), intact_step=probed.restored_step)
    why = "it did not restart" if probed is None else f"it was {probed.kind.value} too"
    return dataclasses.replace(verdict, findings=verdict.findings + (
        f"no intact older checkpoint: with the step-{step} save's files moved aside, a fresh restart did not "
        f"recover ({why})",))


def _remove_empty_parents(directory: Path, root: Path) -> None:
    while directory != root and directory.is_relative_to(root) and not any(directory.iterdir()):
        directory.rmdir()
        directory = directory.parent
