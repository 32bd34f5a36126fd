"""S3 faults at the HTTP layer, where the client really meets them: rules of the case's fault
proxy (`resilience.objectstore.proxy`) during the first run.

The proxy sees every request of every rank; a rule acts only on requests of the first run's rank
processes (found from the connection's socket in ``/proc``), never on the harness's own. Before it
acts, the fault writes ``fault_fired`` into that rank's events, so the evidence names the rank,
the request and the action. The restart runs with no rule; its requests are logged too.
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, ClassVar

from ...core.case import FaultSpec
from ...core.events import ClockPhase, Event, EventLog, read_events
from ...core.plan import FIRST_RUN, events_file
from ...objectstore.proxy import ACTIONS, METHODS, ProxyRule, Request
from ..base import CaseEnvironment, Fault

COUNTS = ("nth", "count")
SECONDS = ("for_s", "delay_s")


class ObjectStoreFault(Fault):
    """``action`` on the requests of the first run matching ``method`` and the ``key`` glob
    (relative to the checkpoint root; ``copy: true`` only server-side copies, the first half of an
    S3 rename; ``false``: never them), from the ``nth`` match on, ``count`` times or for ``for_s``
    seconds: ``slow_down`` (503 SlowDown), ``internal_error`` (500 InternalError), ``reset`` (the
    connection is reset once ``after_bytes`` of the body reached the server), ``delay`` (``delay_s``
    seconds before it is relayed), ``kill`` (SIGKILL of the rank that sent it, once ``after_bytes``
    of its body reached the server, or without ``after_bytes`` once the server answered and before
    the answer reaches the rank: between the copy and the delete of a rename).

    Harness side only: ``setup`` installs the rule, ``supervise`` learns the first run's rank
    processes, ``heal`` removes the rule before the restart."""

    kind = "s3"
    needs_trigger = False
    supervises = True
    on_objects = True
    needs_object_store = True
    params: ClassVar[dict[str, tuple[Any, Any]]] = {
        "action": (ACTIONS, "slow_down"), "method": (METHODS, "PUT"), "key": (str, "*"),
        "copy": (object, None), "nth": (object, 1), "count": (object, 1), "for_s": (object, None),
        "after_bytes": (object, None), "delay_s": (object, 1.0)}

    def __init__(self, spec: FaultSpec):
        super().__init__(spec)
        self.ranks: dict[int, Any] = {}  # pid -> RankProcess of the first run
        self.case_dir: Path | None = None

    @classmethod
    def check(cls, spec: FaultSpec) -> tuple[str, str, Any, Any] | None:
        params = spec.params
        for key in COUNTS:
            value = params[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return (f"fault.{key}", "must be a whole number of requests", value, "an integer >= 1")
        for key in SECONDS:
            value = params[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                return (f"fault.{key}", "must be a number of seconds", value, "a number > 0")
        after = params["after_bytes"]
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
            return ("fault.after_bytes", "must be a byte count", after, "an integer >= 0")
        if params["copy"] not in (None, True, False):
            return ("fault.copy", "must say whether only copies match", params["copy"], "true, false")
        if params["action"] == "reset" and after is None:
            return ("fault.after_bytes", "missing: a reset cuts the body after a byte count", None, "an integer >= 0")
        if after is not None and params["action"] not in ("reset", "kill"):
            return ("fault.after_bytes", f"has no meaning for action {params['action']!r}", after, "reset, kill")
        return None

    def rule(self) -> ProxyRule:
        p = self.spec.params
        return ProxyRule(action=p["action"], method=p["method"], key=p["key"], copy=p["copy"], nth=p["nth"],
                         count=p["count"], for_s=p["for_s"], after_bytes=p["after_bytes"],
                         delay_s=float(p["delay_s"] or 0))

    def setup(self, env: CaseEnvironment) -> None:
        self.case_dir = env.case_dir
        proxy = env.object_store.proxy
        proxy.on_act, proxy.kill = self._may_act, self._kill
        proxy.add(self.rule())

    def supervise(self, events: list[dict], ranks: list) -> None:
        self.ranks = {process.pid: process for process in ranks}

    def heal(self, env: CaseEnvironment) -> None:
        env.object_store.proxy.clear()
        self.ranks = {}

    def _may_act(self, rule: ProxyRule, request: Request, pid: int | None) -> bool:
        process = self.ranks.get(pid)
        if process is None:  # not a rank of this first run: the harness's own, or the restart's
            return False
        path = events_file(self.case_dir / FIRST_RUN, process.rank)
        step, phase = where_rank_is(read_events(path))
        log = EventLog(path, process.rank)
        log.emit(Event.FAULT_FIRED, kind=self.kind, step=step, phase=phase, point=rule.action, file=request.key,
                 offset=rule.after_bytes, method=request.method, query=request.query,
                 copy_source=request.copy_source, pid=pid, ends_process=rule.action == "kill")
        log.close()
        return True

    def _kill(self, pid: int | None) -> None:
        process = self.ranks.get(pid)
        if process is not None:  # a process this case started, by its pid
            process.signal(signal.SIGKILL)


def where_rank_is(events: list[dict]) -> tuple[int, str]:
    """The step and phase a rank is in, from its events so far: inside the last save it began and
    has not returned from ("save"), otherwise after its last train step ("train")."""
    step, phase = 0, ClockPhase.TRAIN
    for event in events:
        if event["event"] == Event.SAVE_BEGIN:
            step, phase = event["step"], ClockPhase.SAVE
        elif event["event"] in (Event.SAVE_RETURNED, Event.LOSS):
            step, phase = event["step"], ClockPhase.TRAIN if event["event"] == Event.LOSS else ClockPhase.IDLE
    return step, phase
