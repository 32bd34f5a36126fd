"""Inside the rank processes of a user's own training script (black-box mode), loaded at interpreter
start by ``resilience/rank/startup/sitecustomize.py`` when ``RESILIENCE_BLACKBOX`` is set.

It records what the script prints under the log contract (`contract`) into the incarnation's event
log, with times, and, in the first incarnation only, arms the fault: the rank's place is taken from
the contract lines it prints (after ``RESILIENCE step=N ...`` the rank is "in the save of step N"
until its next step line), and checkpoint writes are reached through the interception layer.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..core.log_contract import parse_line

ENV_VAR = "RESILIENCE_BLACKBOX"
_OWNER_ENV = "RESILIENCE_BLACKBOX_RANK_PID"  # set by the rank: its own children are not ranks


def install(config_text: str) -> None:
    if "RANK" not in os.environ or os.environ.get(_OWNER_ENV):
        return  # torchrun's agent, or a process the rank started
    os.environ[_OWNER_ENV] = str(os.getpid())
    config = json.loads(config_text)
    from ..core.elastic_layout import Incarnation
    from ..core.events import EventLog
    from ..faults.base import Clock, RankEnvironment, WriteListener
    from .worker import die_with_parent, exception_chain

    die_with_parent()  # an unmodified script never asks for it; no rank may outlive the driver
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver's HANG report: where it waits
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    incarnation = Incarnation.from_environment(os.environ)
    directory = Path(config["run_dir"]) / incarnation.name
    directory.mkdir(parents=True, exist_ok=True)
    events = EventLog(directory / f"rank{rank}.events.jsonl", rank)
    events.emit("started", launch=incarnation.launch, restart_count=incarnation.restart)
    clock = Clock()
    fault = None
    if config.get("fault") and incarnation.is_first:
        from ..core import registry
        from ..core.case import FaultSpec, Trigger
        from ..disk.interception import Interceptor

        document = config["fault"]
        spec = FaultSpec(kind=document["kind"], trigger=Trigger(**document["trigger"]), params=document["params"])
        fault = registry.resolve("fault", spec.kind)(spec)
        checkpoint_dir = Path(config["checkpoint_dir"])
        fault.arm(RankEnvironment(rank=rank, world_size=world_size, checkpoint_dir=checkpoint_dir, clock=clock,
                                  emit=events.emit, case_dir=directory))
        if isinstance(fault, WriteListener) and fault.needs_interception():
            Interceptor(checkpoint_dir, [fault]).install()
    sys.stdout = ContractReader(sys.stdout, events, clock, fault)
    previous_hook = sys.excepthook

    def record_error(kind, value, tb):  # the script's uncaught exception: the evidence of LOUD
        import traceback

        events.emit("error", type=kind.__name__, message=str(value)[:4000], chain=exception_chain(value),
                    traceback="".join(traceback.format_exception(kind, value, tb))[-8000:])
        previous_hook(kind, value, tb)

    sys.excepthook = record_error


class ContractReader:
    """The script's stdout, passed through unchanged; contract lines also become events (and move
    the rank's clock, where a fault reads it)."""

    def __init__(self, stream, events, clock, fault):
        self._stream, self._events, self._clock, self._fault = stream, events, clock, fault
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
            self._events.emit("contract_violation", message=str(exc))
            return
        if entry is None:
            return
        if entry.kind == "step":
            self._events.emit("loss", step=entry.step, loss=entry.loss)
            self._clock.step, self._clock.phase = entry.step, "save"  # its checkpoint comes next, if any
            if self._fault is not None:
                self._fault.at("save", entry.step)
        elif entry.kind == "saved":
            self._events.emit("save_returned", step=entry.step)
        else:
            self._events.emit("restored", step=entry.step)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)
