"""Rank files -> evidence: a phase's `PhaseResult` from the events and logs its ranks left, the
first error that counts, and where a hung rank waits. The same rules whoever started the ranks
(the harness, torchrun's agent, a user's script in black-box mode).
"""
from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterable
from dataclasses import replace

from ..core.events import Event, EventFollower, read_events, tail
from ..core.plan import PhasePlan
from ..core.records import PhaseResult, PhaseStatus, RankError, RankRecord


def collect_phase(plan: PhasePlan, status: PhaseStatus, codes: list[int | None], elapsed: float) -> PhaseResult:
    """A phase's result from the files its ranks wrote (``codes``: exit statuses, None for a rank
    torn down by its launcher). A failed phase whose first failure is an injected kill becomes
    ``fault_killed``: the errors of the peers are its consequences."""
    records = []
    for rank, code in enumerate(codes):
        out_path, err_path = plan.log_paths(rank)
        records.append(RankRecord(rank=rank, returncode=code, events=tuple(read_events(plan.events_path(rank))),
                                  stdout_tail=tail(out_path), stderr_tail=tail(err_path)))
    fault_events = tuple(e for r in records for e in r.events if e["event"] == Event.FAULT_FIRED)
    first_error = None
    if status == PhaseStatus.FAILED:
        first_error = first_error_of(plan.name, records)
        if first_error is None:
            status = PhaseStatus.FAULT_KILLED
    return PhaseResult(name=plan.name, world_size=plan.world_size, status=status, ranks=tuple(records),
                       first_error=first_error, fault_events=fault_events, elapsed_s=elapsed)


def collect_again(plan: PhasePlan, phase: PhaseResult) -> PhaseResult:
    """``phase`` read again from its ranks' files, as it ended: for events a process outside the
    ranks wrote after they ended (a fault in a node agent that finished the job's work)."""
    status = PhaseStatus.FAILED if phase.status == PhaseStatus.FAULT_KILLED else phase.status
    again = collect_phase(plan, status, [record.returncode for record in phase.ranks], phase.elapsed_s)
    return replace(again, hang_summary=phase.hang_summary)


def follow_phase_events(plan: PhasePlan) -> EventFollower:
    """Every event every rank of the phase has written so far, read as the files grow."""
    return EventFollower(lambda: [plan.events_path(rank) for rank in range(plan.world_size)])


def first_error_of(phase: str, records: Iterable[RankRecord]) -> RankError | None:
    """The earliest failure of a phase (an exception a rank reported, or a death without one),
    unless an injected kill came first: then the peers' errors are its consequences."""
    records = list(records)
    errors = []
    for record in records:
        raised = [e for e in record.events if e["event"] == Event.ERROR]
        if raised:
            errors.append(error_from_event(raised[0], phase, record.rank))
        elif record.returncode not in (None, 0) and not any(e.get("ends_process") for e in record.events):
            errors.append(_crash(phase, record))
    return earliest_unless_killed(errors, [e for r in records for e in r.events if e["event"] == Event.FAULT_FIRED])


def earliest_unless_killed(errors: list[RankError], fault_events: Iterable[dict]) -> RankError | None:
    """The rule behind every LOUD: the earliest error, unless a fault that ends a process fired
    before it (or at the same time)."""
    kill_times = [e["time"] for e in fault_events if e.get("ends_process")]
    errors = sorted(errors, key=lambda e: e.time)
    if not errors or (kill_times and min(kill_times) <= errors[0].time):
        return None
    return errors[0]


def error_from_event(event: dict, phase: str, rank: int | None = None) -> RankError:
    """The `RankError` of an ``error`` event a rank wrote."""
    return RankError(event["rank"] if rank is None else rank, phase, event["type"], event["message"],
                     event.get("traceback", ""), event["time"], tuple(event.get("chain", ())))


def _crash(phase: str, record: RankRecord) -> RankError:
    """A rank that died without raising (segfault, std::terminate, an outside SIGKILL): still loud."""
    code = record.returncode
    if code is not None and code < 0:
        what = f"rank {record.rank} killed by {signal.Signals(-code).name}"
    else:
        what = f"rank {record.rank} exited with status {code} without raising"
    last_lines = [line for line in record.stderr_tail.strip().splitlines() if line.strip()][-3:]
    message = what + (": " + " | ".join(last_lines) if last_lines else "")
    return RankError(record.rank, phase, "Crash", message, record.stderr_tail, time.time())


FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def where_waiting(record: RankRecord, stopped: bool) -> str:
    """From a rank's faulthandler dump: the collective it waits in and the first frame outside torch."""
    if stopped:
        return f"rank {record.rank}: stopped (SIGSTOP), so it cannot dump its stack"
    return waiting_place(record.rank, record.stderr_tail)


def waiting_place(rank: int, text: str, outside: tuple[str, ...] = ("/torch/",)) -> str:
    """Where the last faulthandler dump in ``text`` shows the rank: the collective it waits in and
    the first frame whose path names none of ``outside``."""
    dump = text.rsplit("most recent call first", 1)
    if len(dump) < 2:
        return f"rank {rank}: no stack dumped"
    frames = [m.groupdict() for m in map(FRAME.match, dump[1].splitlines()) if m]
    collective = next((f["func"] for f in frames if f["path"].endswith("distributed_c10d.py")), None)
    caller = next((f for f in frames if not any(part in f["path"] for part in outside)), None)
    where = f"{caller['path']}:{caller['line']} in {caller['func']}" if caller else "unknown"
    return f"rank {rank}: " + (f"waiting in {collective}, called from {where}" if collective else f"at {where}")


def stderr_tails(phase: PhaseResult) -> str:
    """Every rank's stderr tail, for an error message about the phase."""
    return "\n".join(f"--- rank {r.rank} stderr ---\n{r.stderr_tail}" for r in phase.ranks if r.stderr_tail.strip())


_RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Timeout)): ?(?P<message>.*)$")


def launcher_error(log_text: str, phase: str) -> RankError | None:
    """The exception a launcher (torchrun's agent) ended with, from its output, as the evidence of
    a phase no rank started (its last ``Type: message`` line); None when it raised none."""
    lines = [match for line in log_text.splitlines() if (match := _RAISED.match(line.strip()))]
    if not lines:
        return None
    last = lines[-1]
    return RankError(rank=-1, phase=phase, type=last["type"].rsplit(".", 1)[-1], message=last["message"],
                     traceback=tail_text(log_text), time=time.time())


def tail_text(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
