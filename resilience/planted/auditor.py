"""The audit's judge (`resilience audit`, `resilience.commands.audit`): each scenario Hypothesis draws
(`fuzz.audit`) becomes a catcher and the strategy runs in it in real ranks, judged as the planted
bugs are (`planted.trials.run_trial`). With a control (the strategy's correct twin) a draw the
strategy fails counts only if the twin passes it; a draw both fail is reported apart.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

from ..fuzz.audit import FAULTS, Draw, search, shrink
from ..fuzz.search import write_document
from .catalogue import Catcher
from .trials import ACCEPTED, CAUGHT, run_trial

FAILS_CONTROL = "control fails"  # caught, and so is the correct twin: not the audited change's failure


def catcher_of(draw: Draw) -> Catcher:
    """The drawn scenario as a catcher: what a correct strategy may give in it."""
    accepts, fallback_ok = FAULTS[draw.fault]
    return Catcher(f"audit: {draw.describe()}", f"drawn by resilience audit: {draw.describe()}", draw.document(),
                   accepts, fallback_ok=fallback_ok)


class Auditor:
    """Runs drawn scenarios for one strategy through the harness, counting and printing each."""

    def __init__(self, harness, strategy: str, control: Any = None, report=print):
        self.harness, self.strategy, self.control, self.report = harness, strategy, control, report
        self.runs: list[tuple[Draw, str]] = []  # every draw judged, with its judgement
        self.real_runs = 0  # the strategy's runs and the control's

    def judge(self, draw: Draw) -> str:
        trial = self._run(draw, self.strategy)
        judgement = trial.judgement
        if judgement == CAUGHT and self.control is not None:
            twin = self._run(draw, self.control, as_control=True)
            if twin.judgement != ACCEPTED:
                judgement = FAILS_CONTROL
                self.report(f"  {FAILS_CONTROL:<14} the control {self.control} fails it too ({twin.verdict or '-'}): "
                            "not counted")
        self.runs.append((draw, judgement))
        return judgement

    def _run(self, draw: Draw, strategy: Any, as_control: bool = False):
        label = f"control of {self.strategy}" if as_control else self.strategy
        trial = run_trial(self.harness, catcher_of(draw), strategy, label)
        self.real_runs += 1
        self.report(f"  {trial.judgement:<14} {trial.verdict or '-':<9} {draw.describe()}"
                    + (" [control]" if as_control else "")
                    + (f": {trial.evidence[:140]}" if trial.evidence else ""))
        return trial

    def control_failures(self) -> list[Draw]:
        return [draw for draw, judgement in self.runs if judgement == FAILS_CONTROL]

    def audit(self, profile: str, runs: int, shrink_runs: int) -> tuple[Draw | None, int]:
        """The shrunk draw the strategy fails (or None), and the real runs the shrink spent."""
        def counted() -> int:
            return self.real_runs

        found = search(self.judge, profile, runs, zlib.crc32(self.strategy.encode()), counted)
        if found is None:
            return None, 0
        self.report(f"caught: {found.describe()}; shrinking (at most {shrink_runs} runs)")
        return shrink(found, self.judge, shrink_runs, counted)

    def write(self, found: Draw, directory: Path) -> Path:
        document = catcher_of(found).scenario(self.strategy, f"resilience audit of {self.strategy}")
        return write_document(directory, "audit", self.strategy, document)
