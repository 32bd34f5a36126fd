"""A hostile checkpoint: a file that still loads to exactly the state it held, but whose pickle
first runs code of someone else's choosing, as a checkpoint taken from a model hub, a shared
bucket or a colleague's directory can.

After the ``step`` save returned on every rank, the trigger rank rewrites every file matching
``file`` written during that save: a `Carrier` of the original object, whose unpickling calls
``os.makedirs`` on a canary path inside the case directory (the payload), then returns the
original object. Torch zip files stay torch zip files (tensors stay tensors); a raw pickle (DCP's
``.metadata``) stays a raw pickle. The job then stops and the restart restores from it.

A loader that unpickles in full (``torch.load(weights_only=False)``, ``pickle.load``) runs the
payload and, since it then gets the right object, goes on as if nothing happened;
``torch.load(weights_only=True)`` refuses the file ("Weights only load failed ... Unsupported
global"). After the last phase the harness asks the fault for its `findings`: a canary that
exists means a checkpoint file executed code in the job, and the verdict is SILENT whatever else
happened.
"""
from __future__ import annotations

import json
import operator
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.events import Event
from ...core.plan import RESTART
from ...core.records import PhaseStatus
from ...disk.trace_targets import is_selector
from ..base import CaseEnvironment
from .damage import DamageAfterSave

if TYPE_CHECKING:
    from ...core.records import PhaseResult

CANARY_DIR = "malicious_pickle"  # under the case directory, never outside it
RECORD = "carriers.json"  # which file carries which canary, for the harness side
ZIP_MAGIC = b"PK\x03\x04"
TORCH_ZIP, PICKLE = "torch zip", "pickle"


@dataclass(frozen=True)
class Payload:
    """Unpickled, creates ``canary``: the proof that the file's code ran."""

    canary: str

    def __reduce__(self):
        # makedirs with exist_ok rather than mkdir: several ranks may load the same file (torch.rank0),
        # and a second run of the payload must not turn into a load error that hides the first
        return (os.makedirs, (self.canary, 0o755, True))


@dataclass(frozen=True)
class Carrier:
    """Unpickled, runs `Payload` and then is the ``original`` object: nothing looks wrong after."""

    payload: Payload
    original: Any

    def __reduce__(self):
        # getitem((payload result, original), 1): the tuple's first item is built (the payload
        # runs) before the original is handed back
        return (operator.getitem, ((self.payload, self.original), 1))


def plant(path: Path, canary: Path) -> str:
    """Rewrite ``path`` so that unpickling it first creates ``canary``; returns the file's format."""
    import torch

    with open(path, "rb") as file:
        magic = file.read(len(ZIP_MAGIC))
    if magic == ZIP_MAGIC:
        # Full unpickling here only: this case's own strategy wrote the file moments ago in this
        # first run, and it is the one way to read back whatever objects a library pickled
        # (DeepSpeed's loss scaler, ...) without knowing each strategy's classes.
        original = torch.load(path, weights_only=False)
        torch.save(Carrier(Payload(str(canary)), original), path)
        return TORCH_ZIP
    original = _single_pickle(path)
    with open(path, "wb") as file:
        pickle.dump(Carrier(Payload(str(canary)), original), file)
    return PICKLE


def can_carry(path: Path) -> bool:
    with open(path, "rb") as file:
        head = file.read(len(ZIP_MAGIC))
    return head == ZIP_MAGIC or head[:1] == b"\x80"  # a zip, or a pickle of protocol 2 or later


def _single_pickle(path: Path) -> Any:
    """The one object pickled in ``path`` (written by this case's strategy, as above)."""
    with open(path, "rb") as file:
        try:
            original = pickle.load(file)
        except Exception as exc:
            raise ValueError(f"{path}: neither a torch zip file nor a pickle "
                             f"({type(exc).__name__}: {exc}); it cannot carry a payload") from exc
        if file.read(1):
            raise ValueError(f"{path}: more than one pickle in the file (a legacy torch file?); "
                             f"only torch zip files and single pickles can carry a payload")
    return original


MTIME_TICK_S = 0.05


def when(ran_at: float, phases: tuple[PhaseResult, ...]) -> str:
    """The part of the case during which a payload ran, from the canary's time and the restart's events."""
    restart = next((phase for phase in phases if phase.name == RESTART), None)
    joined = [event["time"] for event in restart.events(Event.JOINED)] if restart else []
    # a file's mtime comes from the kernel's coarse clock, up to a tick (4-10 ms) behind time.time():
    # a payload run a few ms after the rank joined can carry an mtime before it, while the first
    # run ended seconds earlier
    if not joined or ran_at < min(joined) - MTIME_TICK_S:
        return "the first run (before the restart began)"
    restored = [event["time"] for event in restart.events(Event.RESTORED)]
    if not restored or ran_at <= max(restored):
        return "the restart's restore"
    return "the restart, after its restore"


class MaliciousPickle(DamageAfterSave):
    """Every matching file rewritten so that it still loads to the same state but unpickling it first
    runs a payload (it creates a canary in the case directory): a hostile checkpoint. Full unpickling
    runs it (SILENT, whatever else happens); ``torch.load(weights_only=True)`` refuses the file."""

    kind = "malicious_pickle"

    def pick(self, changed: list[str]) -> list[str]:
        """With a trace target, those of the rank's files that can carry a payload (a torch zip file
        or a pickle: a marker or a text pointer cannot)."""
        if not is_selector(self.trigger.file):
            return changed
        return [r for r in changed if can_carry(self.env.checkpoint_dir / r)]

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        case_dir = self.env.case_dir
        (case_dir / CANARY_DIR).mkdir(exist_ok=True)
        carriers = []
        for index, path in enumerate(paths):
            canary = case_dir / CANARY_DIR / f"payload_ran.{index}"
            carriers.append({"file": path.relative_to(self.env.checkpoint_dir).as_posix(),
                             "canary": canary.relative_to(case_dir).as_posix(), "format": plant(path, canary)})
        (case_dir / CANARY_DIR / RECORD).write_text(json.dumps(carriers, indent=1))
        return {"carriers": carriers}

    def findings(self, env: CaseEnvironment, phases: tuple[PhaseResult, ...]) -> tuple[str, ...]:
        record = env.case_dir / CANARY_DIR / RECORD
        if not record.exists():  # the fault never fired: the outcome says so
            return ()
        restart = next((phase for phase in phases if phase.name == RESTART), None)
        after = ", and the job went on" if restart is not None and restart.status == PhaseStatus.COMPLETED else ""
        found = []
        for carrier in json.loads(record.read_text()):
            canary = env.case_dir / carrier["canary"]
            if canary.exists():
                found.append(f"{carrier['file']}: its pickle ran the payload planted in it ({carrier['canary']} "
                             f"created) during {when(canary.stat().st_mtime, phases)}: a checkpoint file "
                             f"executed code in the job{after}")
        return tuple(found)
