"""Damage at rest that puts the wrong content under a right name: another rank's file copied over
a file (``duplicate_file``), a pointer file naming a stale or missing tag (``stale_pointer``).
The trigger and the stop are those of every damage at rest (`resilience.faults.at_rest.damage`)."""
from __future__ import annotations

import json
import shutil
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from ...core.confined import resolve_under
from ...core.events import ClockPhase
from ...disk.trace_targets import POINTER, is_selector
from ..base import ReadListener
from .damage import DamageAfterSave


class DuplicateFile(DamageAfterSave):
    """The one file written during the save that matches ``source`` (say rank 0's shard) copied
    over every file matching ``file`` (rank 1's): a copy or sync tool that mixed up two names.
    When no file written during the save matches ``source``, the one older file that does (an
    earlier step's ``.metadata``: a stale copy restored over the new one)."""

    kind = "duplicate_file"
    params = {"source": (str, None)}
    on_objects = True  # an object copied over another whole, as a sync tool's copy does

    @classmethod
    def check(cls, spec):
        if not spec.params.get("source"):
            return ("fault.source", "missing: the glob of the file copied over the target", None,
                    "a glob relative to the checkpoint directory, e.g. '*_rank_0.pt'")
        return None

    def pick(self, changed: list[str]) -> list[str]:
        source = self.spec.params["source"]
        if is_selector(source):  # a file the source rank wrote too (a shared pointer) is no target
            return [relative for relative in changed if relative not in self.tracer.resolve(source)]
        return [relative for relative in changed if not fnmatchcase(relative, source)]

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        names = []
        for path in paths:
            name = self._source(path.relative_to(self.env.checkpoint_dir).as_posix())
            shutil.copyfile(resolve_under(self.env.checkpoint_dir, name), path)
            names.append(name)
        return {"source": names[0] if len(set(names)) == 1 else names}

    def damage_objects(self, relatives: list[str]) -> dict[str, Any]:
        from ...objectstore.objects import copy_object

        name = self._source()
        for relative in relatives:
            copy_object(self.env.checkpoint_url, name, relative)
        return {"source": name}

    def _source(self, target: str = "") -> str:
        if is_selector(self.spec.params["source"]):
            return counterpart(target, self.tracer.resolve(self.spec.params["source"]), self.env.checkpoint_dir)
        before = self._before or {}
        matching = {r: identity for r, identity in self.identities().items()
                    if fnmatchcase(r, self.spec.params["source"])}
        sources = sorted(r for r, identity in matching.items() if before.get(r) != identity) or sorted(matching)
        if len(sources) != 1:
            raise ValueError(f"fault.source {self.spec.params['source']!r} must match exactly one file written "
                             f"during the step-{self.trigger.step} save, or else one older file; it matched {sources}")
        return sources[0]


def counterpart(target: str, candidates: list[str], root: Path) -> str:
    """Among the files another rank wrote, the one that stands where ``target`` stands: in its
    directory, named the same but for digits (a rank number), else the nearest in size."""
    def shape(name: str) -> str:
        return "".join(c for c in name if not c.isdigit())

    folder = target.rpartition("/")[0]
    near = [c for c in candidates if c.rpartition("/")[0] == folder] or candidates
    if not near:
        raise ValueError(f"the source rank wrote no file during the save to copy over {target}")
    alike = [c for c in near if shape(c) == shape(target)]
    size = (root / target).stat().st_size
    return min(alike or near, key=lambda c: (abs((root / c).stat().st_size - size), c))


POINTER_TARGETS = ("older", "missing")


class StalePointer(DamageAfterSave, ReadListener):
    """The pointer file (``file``, e.g. DeepSpeed's ``latest``) rewritten to name an ``older`` tag
    (the newest other directory beside it: a pointer update that never reached the disk) or a
    ``missing`` one (a tag whose directory does not exist: the shards were cleaned up or never
    synced). ``file: "@pointer"``: whatever file every rank reads first at restore, when the
    step-``step`` save rewrote it and its text names that save; the first run then only stops
    after that save, and the restart's first read of it, before it happens, rewrites it to what
    it said one save earlier (`traced.SaveTracer.first_read`)."""

    kind = "stale_pointer"
    params = {"points_to": (POINTER_TARGETS, "older")}
    trace_targets = ("written_by", "pointer")
    arms_at_restart = True  # only with @pointer does it act there

    @classmethod
    def check(cls, spec):
        if not is_selector(spec.trigger.file) and any(c in spec.trigger.file for c in "*?["):
            return ("fault.file", "must name the pointer file itself", spec.trigger.file, "e.g. latest, or @pointer")
        return None

    def pointer_mode(self) -> bool:
        return self.trigger.file == POINTER

    @property
    def damages_files(self) -> bool:  # @pointer: the first run only stops; the restart acts
        return not self.pointer_mode()

    def arm(self, env) -> None:
        super().arm(env)
        self._read_once = False

    def needs_read_interception(self) -> bool:
        return self.pointer_mode() and self.env.incarnation == "restart"

    def wants_read(self, relative: str) -> bool:
        return not self._read_once and self.env.clock.phase == ClockPhase.LOAD

    def on_open_read(self, path: Path, relative: str) -> None:
        if self._read_once:
            return
        self._read_once = True
        decision = self.tracer.first_read(relative, path, lambda p, old, new: p.write_text(new),
                                          missing=self.spec.params["points_to"] == "missing")
        if decision is not None:
            self.fired(point="open", file=relative, pointer=[decision["old"].strip(), decision["new"].strip()])

    def notes(self, env, phases) -> tuple[str, ...]:
        if not self.pointer_mode():
            return ()
        from ...disk.trace_targets import TRACE_DIR

        decision_path = env.case_dir / TRACE_DIR / "pointer.json"
        reads = {p.name.removeprefix("first_read_rank"): p.read_text()
                 for p in sorted((env.case_dir / TRACE_DIR).glob("first_read_rank*"))}
        if not decision_path.exists():
            return ("@pointer: no rank read a file at restore",)
        decision = json.loads(decision_path.read_text())
        first = ", ".join(f"rank {r} {f}" for r, f in reads.items())
        if decision.get("new") is None:
            return (f"@pointer: no pointer; first reads at restore: {first}; {decision['file']}: {decision['why']}",)
        return (f"@pointer: {decision['file']} is the pointer (first reads at restore: {first}); it named "
                f"{decision['old'].strip()!r}, set to {decision['new'].strip()!r}",)

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        if self.pointer_mode():
            return {"action": "stop"}
        changes = []
        for path in paths:
            current = path.read_text().strip()
            if self.spec.params["points_to"] == "missing":
                new = f"{current}-missing"
            else:
                # an iteration tracker (Megatron's) names a number: the older tag's iteration then
                name_of = (lambda d: str(int(d.name.lstrip("abcdefghijklmnopqrstuvwxyz_") or 0))) \
                    if current.isdigit() else (lambda d: d.name)
                others = [d for d in path.parent.iterdir() if d.is_dir() and name_of(d) != current
                          and any(d.iterdir())]
                if not others:
                    raise ValueError(f"no older tag beside {path} to point to (it names {current!r})")
                new = name_of(max(others, key=lambda d: d.stat().st_mtime_ns))
            path.write_text(new)
            changes.append([current, new])
        return {"pointer": changes}
