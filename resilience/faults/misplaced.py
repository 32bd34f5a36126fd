"""Damage at rest that puts the wrong content under a right name: another rank's file copied over
a file (``duplicate_file``), a pointer file naming a stale or missing tag (``stale_pointer``).
The trigger and the stop are those of every damage at rest (`resilience.faults.corruption`)."""
from __future__ import annotations

import shutil
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from ..core.confined import resolve_under
from .corruption import DamageAfterSave


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
        return [relative for relative in changed if not fnmatchcase(relative, self.spec.params["source"])]

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        name = self._source()
        for path in paths:
            shutil.copyfile(resolve_under(self.env.checkpoint_dir, name), path)
        return {"source": name}

    def damage_objects(self, relatives: list[str]) -> dict[str, Any]:
        from ..objectstore.objects import copy_object

        name = self._source()
        for relative in relatives:
            copy_object(self.env.checkpoint_url, name, relative)
        return {"source": name}

    def _source(self) -> str:
        before = self._before or {}
        matching = {r: identity for r, identity in self.identities().items() if fnmatchcase(r, self.spec.params["source"])}
        sources = sorted(r for r, identity in matching.items() if before.get(r) != identity) or sorted(matching)
        if len(sources) != 1:
            raise ValueError(f"fault.source {self.spec.params['source']!r} must match exactly one file written "
                             f"during the step-{self.trigger.step} save, or else one older file; it matched {sources}")
        return sources[0]


POINTER_TARGETS = ("older", "missing")


class StalePointer(DamageAfterSave):
    """The pointer file (``file``, e.g. DeepSpeed's ``latest``) rewritten to name an ``older`` tag
    (the newest other directory beside it: a pointer update that never reached the disk) or a
    ``missing`` one (a tag whose directory does not exist: the shards were cleaned up or never
    synced)."""

    kind = "stale_pointer"
    params = {"points_to": (POINTER_TARGETS, "older")}

    @classmethod
    def check(cls, spec):
        if any(c in spec.trigger.file for c in "*?["):
            return ("fault.file", "must name the pointer file itself", spec.trigger.file, "e.g. latest")
        return None

    def damage(self, paths: list[Path]) -> dict[str, Any]:
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
