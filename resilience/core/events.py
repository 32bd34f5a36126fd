"""What ranks leave behind: their JSON-lines event files (written by `EventLog`, read whole by
`read_events`, followed while they grow by `EventFollower`) and the tails of their logs."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .wire import WireName

LOG_TAIL_CHARS = 3000


class Event(WireName):
    """The kind of a rank event (its ``event`` field): a str, so a record is plain JSON and a
    kind compares equal to its name as read back."""

    JOINED = "joined"  # a rank of the harness is in its group (its pid, device, software)
    STARTED = "started"  # a rank of a user's script started (black-box mode)
    NETWORK_JOINED = "network_joined"  # a rank moved into its network namespace
    PHASE_BEGIN = "phase_begin"  # a torchrun rank began a phase (its incarnation, node, restarts)
    RESTORED = "restored"  # the step a restore came back at, with the state's fingerprint
    STATE = "state"  # the state after a step (the reference's, for the oracle)
    LOSS = "loss"  # one optimizer step's loss
    TRAINED = "trained"  # the samples a step trained (the data audit)
    CHECK_LOSS = "check_loss"  # the loss recomputed from a loaded checkpoint (verify)
    VERIFIED = "verified"  # a saved check's restore of one step
    SAVE_BEGIN = "save_begin"
    SAVE_RETURNED = "save_returned"
    STOPPED_AFTER_SAVE = "stopped_after_save"  # a rank that ends once its save of a step returned
    OBSERVED_STEP = "observed_step"  # a script's step as torch's hooks saw it: its loss, its state before
    STEP_DONE = "step_done"  # a script's state once stepped
    STATE_AT_EXIT = "state_at_exit"  # a script rank that trained no step: the state it loaded
    FILE_WRITTEN = "file_written"  # a file closed under the checkpoint directory
    FILE_READ = "file_read"  # a file a restarted script rank opened before its first backward
    FOREIGN_READ = "foreign_read"  # a rank read another node's local disk
    PATH_OBSERVED = "path_observed"  # a path under the checkpoint directory a restoring rank looked at
    CONTRACT_VIOLATION = "contract_violation"  # a script's log contract line that breaks its rules
    FAULT_WAITING = "fault_waiting"  # an armed fault waits for its moment (the harness acts then)
    FAULT_FIRED = "fault_fired"
    FAULT_MISSED = "fault_missed"  # a fault whose trigger the run never reached
    WRITE_STALLED = "write_stalled"  # a write held by a fault
    PREEMPTED = "preempted"  # a rank received the preemption notice
    TRACE_COMPLETE = "trace_complete"  # a traced save's IO is all recorded (power loss)
    ERROR = "error"  # an exception that ended the rank
    DONE = "done"  # the rank finished its phase


class ClockPhase(WireName):
    """What a rank is doing (`Clock.phase`), as faults watch it and as events report it."""

    IDLE = "idle"
    TRAIN = "train"
    SAVE = "save"
    LOAD = "load"  # restoring
    EMERGENCY = "emergency"  # the worker's emergency save after SIGTERM (faults may watch its writes)


class EventLog:
    """Append-only JSON lines, flushed per event so a SIGKILL loses nothing already emitted."""

    def __init__(self, path: Path, rank: int):
        self.rank = rank
        self._file = open(path, "a", buffering=1, encoding="utf-8")

    def emit(self, event: Event, **fields: Any) -> None:
        record = {"event": event, "rank": self.rank, "pid": os.getpid(), "time": time.time(), **fields}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> list[dict]:
    """Every event in ``path``, in order; none when it does not exist. The last line of a killed
    rank may be cut: it is skipped."""
    events = []
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return events
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


class EventFollower:
    """Every event some growing event files hold so far, for a supervisor that polls them five
    times a second: each call parses only the lines appended since the previous one (a long first
    run's files hold thousands of events; re-reading them all cost about 8 ms a poll at 1600
    steps). ``paths`` names the files on each call (files may appear later); a file only grows,
    and a line still being written is read once its newline is there."""

    def __init__(self, paths: Callable[[], Iterable[Path]]):
        self._paths = paths
        self._offsets: dict[Path, int] = {}
        self.events: list[dict] = []

    def __call__(self) -> list[dict]:
        for path in self._paths():
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk.rfind(b"\n") + 1
            for line in chunk[:complete].decode("utf-8", errors="replace").splitlines():
                try:
                    self.events.append(json.loads(line))
                except json.JSONDecodeError:  # as in read_events
                    continue
            self._offsets[path] = offset + complete
        return self.events


def tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ("" when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
