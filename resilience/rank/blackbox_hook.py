"""Inside the rank processes of a user's own training script (black-box mode), loaded at interpreter
start by ``resilience/rank/startup/sitecustomize.py`` when ``RESILIENCE_BLACKBOX`` is set.

It records what the unmodified script does into the incarnation's event log: its losses, step
boundaries and state digests through torch's own hooks (`step_observer`), the files it writes
under the checkpoint directory, its uncaught exception, and the log contract's lines where the
script prints them (`core.log_contract`: an override for loops the hooks cannot see). It arms the
fault in the first incarnation (at a restart too, for a fault on the restore's reads), told
where the rank is by the same hooks: ``train`` of step N from its first backward, ``save`` of step
N after optimizer step N, the save returned at the next backward.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

from ..core.events import ClockPhase, Event
from ..core.log_contract import parse_line

ENV_VAR = "RESILIENCE_BLACKBOX"
_OWNER_ENV = "RESILIENCE_BLACKBOX_RANK_PID"  # set by the rank: its own children are not ranks


def install(config_text: str) -> None:
    if "RANK" not in os.environ or os.environ.get(_OWNER_ENV):
        return  # torchrun's agent, or a process the rank started
    os.environ[_OWNER_ENV] = str(os.getpid())
    config = json.loads(config_text)
    from ..core.elastic_layout import Incarnation
    from ..core.events import ClockPhase, EventLog
    from ..faults.base import Clock, RankEnvironment
    from .fault_arming import arm_in_rank
    from .startup import begin_rank, exception_chain
    from .step_observer import ReadFiles, StepObserver, WrittenFiles

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    incarnation = Incarnation.from_environment(os.environ)
    directory = Path(config["run_dir"]) / incarnation.name
    directory.mkdir(parents=True, exist_ok=True)
    # the driver's HANG report: where this rank waits (the file stays open for the signal handler)
    stacks = open(directory / f"rank{rank}.stacks.txt", "w")  # noqa: SIM115
    begin_rank(stacks)  # an unmodified script never asks to die with its parent; no rank may outlive the driver
    events = EventLog(directory / f"rank{rank}.events.jsonl", rank)
    events.emit(Event.STARTED, launch=incarnation.launch, restart_count=incarnation.restart)
    # a restarted rank is in its restore from its start until its first backward
    clock = Clock(phase=ClockPhase.IDLE if incarnation.is_first else ClockPhase.LOAD)
    written = WrittenFiles(events.emit, clock)
    fault = _armed_fault(config, incarnation)
    arm_in_rank(fault, RankEnvironment(rank=rank, world_size=world_size, checkpoint_dir=Path(config["checkpoint_dir"]),
                                       clock=clock, emit=events.emit, case_dir=Path(config["run_dir"]),
                                       incarnation="first_run" if incarnation.is_first else "restart"),
                listeners=[written], read_listeners=[] if incarnation.is_first else [ReadFiles(events.emit, clock)])
    place = RankPlace(clock, fault, written, events.emit, config.get("stop_after_save"))
    atexit.register(place.exiting)
    observer = StepObserver(events.emit, place.move, place.save_returned)
    observer.install()
    # before place.exiting (last in, first out), which may end the process; never after an error
    atexit.register(lambda: place.failed or observer.exiting())
    sys.stdout = ContractReader(sys.stdout, events, place)
    previous_hook = sys.excepthook

    def record_error(kind, value, tb):  # the script's uncaught exception: the evidence of LOUD
        import traceback

        place.failed = True
        events.emit(Event.ERROR, type=kind.__name__, message=str(value)[:4000], chain=exception_chain(value),
                    traceback="".join(traceback.format_exception(kind, value, tb))[-8000:])
        previous_hook(kind, value, tb)

    sys.excepthook = record_error


def _armed_fault(config: dict, incarnation):
    """The case's fault in the first incarnation; at a restart only a fault that acts on the
    restore's reads (``arms_at_restart``). A later launch of a timeline (``launch_fault``) arms its
    own fault in its first incarnation."""
    if not config.get("fault"):
        return None
    from ..core import registry
    from ..core.case import FaultSpec, Trigger

    document = config["fault"]
    spec = FaultSpec(kind=document["kind"], trigger=Trigger(**document["trigger"]) if document["trigger"] else None,
                     params=document["params"])
    fault_class = registry.resolve("fault", spec.kind)
    first = incarnation.is_first or (config.get("launch_fault") and incarnation.restart == 0)
    return fault_class(spec) if first or fault_class.arms_at_restart else None


class RankPlace:
    """Where the rank is, from the step hooks or the contract lines (whichever sees it first), and
    the armed fault told once per place. A save this rank wrote files in has returned once the
    rank trains on, or once the script ends normally after it (``save_returned``). With
    ``stop_after``, the rank ends (exit status 0) once its save of that step returned, before the
    next step's backward reaches any collective: the checkpoint directory then holds that save, for
    a continuation to resume (`run.script_continuation`)."""

    def __init__(self, clock, fault, written, emit, stop_after: int | None = None):
        self.clock, self.fault, self.written, self.emit = clock, fault, written, emit
        self.stop_after = stop_after
        self.failed = False  # the script raised: its last save did not return

    def move(self, phase: str, step: int) -> None:
        if (self.clock.phase, self.clock.step) == (phase, step):
            return
        self.clock.step, self.clock.phase = step, phase
        if phase == ClockPhase.SAVE:
            self.clock.save_step = step
        if self.fault is not None:
            self.fault.at(phase, step)

    def save_returned(self, step: int) -> None:
        if step in self.written.save_steps:
            self.emit(Event.SAVE_RETURNED, step=step)
        if self.fault is not None:
            self.fault.after_save(None, step)
        if step == self.stop_after:
            self.emit(Event.STOPPED_AFTER_SAVE, step=step)
            sys.stdout.flush()
            os._exit(0)

    def exiting(self) -> None:
        """At a normal exit (atexit also runs after an uncaught exception: not then): a save the
        rank was in has returned, the script's final one."""
        if self.failed or self.clock.phase != ClockPhase.SAVE:
            return
        if self.clock.step in self.written.save_steps:
            self.emit(Event.SAVE_RETURNED, step=self.clock.step)
        if self.fault is not None and self.fault.after_save_at_exit:
            self.fault.after_save(None, self.clock.step)


class ContractReader:
    """The script's stdout, passed through unchanged; contract lines also become events (and move
    the rank's clock, where a fault reads it)."""

    def __init__(self, stream, events, place):
        self._stream, self._events, self._place = stream, events, place
        self._pending = ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._stream.flush()  # on record before a fault may end the process
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._observe(line)
        return written

    def _observe(self, line: str) -> None:
        try:
            entry = parse_line(line)
        except ValueError as exc:  # the driver stops on it: a typo must not pass for a silent run
            self._events.emit(Event.CONTRACT_VIOLATION, message=str(exc))
            return
        if entry is None:
            return
        if entry.kind == "step":
            self._events.emit(Event.LOSS, step=entry.step, loss=entry.loss)
            self._place.move("save", entry.step)  # its checkpoint comes next, if any
        elif entry.kind == "saved":
            self._events.emit(Event.SAVE_RETURNED, step=entry.step)
        else:
            self._events.emit(Event.RESTORED, step=entry.step)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)
