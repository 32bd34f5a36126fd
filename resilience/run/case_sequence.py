"""The one order in which a case's phases run, whoever starts the ranks.

    reference -> setup -> first_run -> check_saves -> heal -> restart -> oracles -> probe -> findings
    then teardown (always, after an exception too), then judge

The saved check runs before the heal, or after it where the fault's heal leaves the saves alone
(a network rule lifted, not a file damaged). The reference runs before ``setup``, so a fault is
never set up for a case whose reference cannot run. A driver that does not take a step names it in
`CaseSequence.skips`, with the reason beside it; the sequence passes over it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from ..core.case import Case
from ..core.records import CaseResult, PhaseResult
from ..faults.base import Fault
from ..faults.environment import CaseEnvironment


class Step(StrEnum):
    REFERENCE = "reference"
    SETUP = "setup"
    FIRST_RUN = "first_run"
    CHECK_SAVES = "check_saves"
    HEAL = "heal"
    RESTART = "restart"
    ORACLES = "oracles"
    PROBE = "probe"
    FINDINGS = "findings"


@dataclass(frozen=True)
class Progress:
    """What the steps found so far; each field is written by the step named beside it."""

    reference: PhaseResult | None = None  # reference (under torchrun: first_run, the job runs it)
    snapshots: Path | None = None  # reference: the reference's snapshots, where a continuation needs them
    first_run: PhaseResult | None = None  # first_run
    checked: tuple[PhaseResult, tuple[int, ...]] | None = None  # check_saves: the phase and the steps it checked
    restart: PhaseResult | None = None  # restart: the judged restore
    later: tuple[PhaseResult, ...] = ()  # restart: a timeline's later launches, or torchrun's later attempts
    continuation: PhaseResult | None = None  # oracles: the restart's oracle where it is not the reference
    oracles: tuple[PhaseResult | None, ...] = ()  # oracles: the oracle of the restart and of each later launch
    more_oracles: tuple[PhaseResult, ...] = ()  # oracles: phases run for the later launches' oracles
    intact_step: int | None = None  # probe: the newest older checkpoint a refused restore could have had
    probes: tuple[PhaseResult, ...] = ()  # probe
    findings: tuple[str, ...] = ()  # findings: what the fault saw go wrong (each makes the verdict SILENT)
    notes: tuple[str, ...] = ()  # findings: what the fault did, in words

    def phases(self) -> tuple[PhaseResult, ...]:
        """Every phase that ran for the case so far, in run order (probes and the saved check apart)."""
        return tuple(phase for phase in (self.reference, self.first_run, self.restart, *self.later,
                                         self.continuation, *self.more_oracles) if phase is not None)


class CaseSequence(ABC):
    """One way to run a case's phases (the local harness, the torchrun driver, the explorer).

    Call order, in the controller process only (under torchrun on several nodes: each node's
    driver): `run` calls each step of `order` not in `skips` as ``step(progress) -> progress``, then
    ``teardown()`` always, then ``judge(progress)``. ``setup``, ``heal`` and ``findings`` do the
    fault's part by default (`resilience.faults.roles.HarnessSide`); ``teardown`` undoes the fault's
    setup; a driver that overrides them calls these too. A step taken but not implemented raises.
    """

    #: the steps this driver does not take, each with its reason in a comment where it is set
    skips: ClassVar[frozenset[Step]] = frozenset()

    def __init__(self, case: Case, fault: Fault, env: CaseEnvironment):
        self.case, self.fault, self.env = case, fault, env

    def order(self) -> tuple[Step, ...]:
        around_heal = (Step.HEAL, Step.CHECK_SAVES) if self.fault.leaves_saves_alone else (Step.CHECK_SAVES, Step.HEAL)
        return (Step.REFERENCE, Step.SETUP, Step.FIRST_RUN, *around_heal, Step.RESTART, Step.ORACLES, Step.PROBE,
                Step.FINDINGS)

    def run(self) -> CaseResult:
        steps = [step for step in self.order() if step not in self.skips]
        progress = Progress()
        if steps[:1] == [Step.REFERENCE]:
            progress = self.reference(progress)
            steps = steps[1:]
        try:
            for step in steps:
                progress = getattr(self, step.value)(progress)
        finally:
            self.teardown()
        return self.judge(progress)

    def reference(self, progress: Progress) -> Progress:
        raise self._not_taken(Step.REFERENCE)

    def setup(self, progress: Progress) -> Progress:
        self.fault.setup(self.env)
        return progress

    @abstractmethod
    def first_run(self, progress: Progress) -> Progress:
        """The first run, the fault armed."""

    def check_saves(self, progress: Progress) -> Progress:
        raise self._not_taken(Step.CHECK_SAVES)

    def heal(self, progress: Progress) -> Progress:
        self.fault.heal(self.env)
        return progress

    @abstractmethod
    def restart(self, progress: Progress) -> Progress:
        """The restart (and any later launch)."""

    def oracles(self, progress: Progress) -> Progress:
        raise self._not_taken(Step.ORACLES)

    def probe(self, progress: Progress) -> Progress:
        raise self._not_taken(Step.PROBE)

    def findings(self, progress: Progress) -> Progress:
        phases = progress.phases()
        return replace(progress, findings=self.fault.findings(self.env, phases),
                       notes=self.fault.notes(self.env, phases))

    def teardown(self) -> None:
        self.fault.teardown(self.env)

    @abstractmethod
    def judge(self, progress: Progress) -> CaseResult:
        """The verdict and the case's result, after ``teardown``."""

    def _not_taken(self, step: Step) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} takes the {step.value} step but does not implement it; "
                                   "name it in skips")
