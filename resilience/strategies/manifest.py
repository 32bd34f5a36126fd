"""A wrapper that makes a checkpoint strategy verify what it restores: a manifest per checkpoint,
with the size and SHA-256 of every file, written last and atomically; the restore verifies every
file and falls back to the newest checkpoint that verifies completely.

    strategy: {name: manifest, options: {inner: torch.per_rank, inner_options: {...}}}

Save, on every rank: the inner strategy's ``save``; a barrier (every rank's files exist); each
rank hashes and fsyncs its share of the files in the inner's ``step_location(step)`` (round
robin, so no rank reads everything); rank 0 gathers the digests, fsyncs the checkpoint
directory, writes ``manifests/step_<NNNNNNNN>.json`` to a temporary name, fsyncs it, renames it
into place and fsyncs ``manifests/``; a final barrier. A checkpoint without its manifest was
never complete, whatever its files say.

Restore, on every rank: rank 0 lists the manifests, newest first, and hands each to every rank;
every rank verifies its share of the files (size, then SHA-256; a file that cannot be read fails
too) and the ranks agree (all-gather) before the first checkpoint that verifies on every rank is
restored with the inner strategy's ``load_step``. Checkpoints that failed are reported on stderr.
If manifests exist but none verifies, the restore raises, naming each failure: starting from
scratch would silently lose every saved step. Option ``keep_last: N``: after the new manifest is
durable, rank 0 removes all but the N newest complete checkpoints. The inner strategy must implement
``step_location`` and ``load_step`` (see `CheckpointStrategy`).

With ``object_store: s3`` (when the inner strategy writes there too) the files, the digests' reads
and the manifests are objects under the case's URL (`resilience.strategies.torch.targets`): there is no
fsync, and a manifest goes up in one PUT, whose object appears whole or not at all, instead of a
temporary name and a rename (on S3 a copy, then a delete).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Mapping

import torch.distributed as dist

from ..core.capabilities import Capability
from ..core.file_comparison import comparing
from ..workloads.base import Workload
from .base import CheckpointStrategy, StrategyContext
from .torch.targets import target_of

MANIFEST_DIR = "manifests"
MANIFEST_NAME = re.compile(r"^step_(\d{8})\.json$")
MANIFEST_FORMAT = 1
#: the inner's capabilities the manifest offers too, forwarding their methods to it (not its version
#: stamp: the manifest's own file records none, so version_mismatch reads the files it traced)
FORWARDED = frozenset({Capability.TAGS, Capability.IN_FLIGHT_STEPS})


def _inner_class(name: Any) -> type:
    from ..core import registry

    return registry.resolve("strategy", name)


class ManifestCheckpoint(CheckpointStrategy):
    options = ("inner", "inner_options", "keep_last")

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> tuple[str, str, Any, Any] | None:
        """Loader-time validation of the wrapped strategy and its options (with the inner's own
        validator, under ``strategy.options.inner_options``)."""
        from ..errors import PluginError
        from ..scenario.capability_check import offering

        inner = options.get("inner")
        allowed = [*(name for name in offering(frozenset({Capability.CHOSEN_STEP}))  # a library's own loop: no
                     if not _inner_class(name).drives_training), "package.module:Class"]
        if not isinstance(inner, str) or not inner:
            return ("strategy.options.inner", "missing: the strategy the manifest wraps", inner, allowed)
        try:
            inner_cls = _inner_class(inner)
        except PluginError as exc:
            return ("strategy.options.inner", str(exc), inner, allowed)
        inner_options = options.get("inner_options", {})
        problem = inner_cls.check_option_values(inner_options, "strategy.options.inner_options")
        if problem:
            return problem
        if inner_cls.drives_training:
            return ("strategy.options.inner", f"{inner_cls.__name__} saves and restores inside its library's own "
                    "loop, which a manifest cannot wrap", inner, allowed)
        if Capability.CHOSEN_STEP not in inner_cls.capabilities_for(inner_options):
            return ("strategy.options.inner", f"{inner_cls.__name__} cannot load a chosen step (it needs "
                    "step_location and load_step)", inner, allowed)
        keep = options.get("keep_last")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            return ("strategy.options.keep_last", "must be a number of checkpoints", keep, "an integer >= 1")
        return None

    @classmethod
    def capabilities_for(cls, options: Mapping[str, Any]) -> frozenset[Capability]:
        """What the inner strategy offers of what the manifest forwards (it picks the step itself)."""
        return FORWARDED & _inner_class(options["inner"]).capabilities_for(options.get("inner_options", {}))

    @classmethod
    def check_object_store(cls, options: Mapping[str, Any], store: str | None) -> tuple[str, str, Any, Any] | None:
        """The manifest goes where its inner strategy writes: a directory, or the object store."""
        problem = _inner_class(options["inner"]).check_object_store(options.get("inner_options", {}), store)
        if problem:
            key, *rest = problem
            return (key.replace("strategy.options.", "strategy.options.inner_options.", 1), *rest)
        return None

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return _inner_class(options["inner"]).trainer(options.get("inner_options", {}))

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        return _inner_class(options["inner"]).trained_by(options.get("inner_options", {}))

    @classmethod
    def workload_options(cls, options: Mapping[str, Any]) -> frozenset[str] | None:
        return _inner_class(options["inner"]).workload_options(options.get("inner_options", {}))

    @classmethod
    def missing_for(cls, options: Mapping[str, Any]) -> str | None:
        return _inner_class(options["inner"]).missing_for(options.get("inner_options", {}))

    warm_restores = True  # the manifest itself keeps nothing between loads; its inner may

    @classmethod
    def restores_warm(cls, options: Mapping[str, Any]) -> bool:
        return _inner_class(options["inner"]).restores_warm(options.get("inner_options", {}))

    def __init__(self, context: StrategyContext):
        super().__init__(context)
        options = context.options
        inner_context = StrategyContext(checkpoint_dir=context.checkpoint_dir, rank=context.rank,
                                        world_size=context.world_size, previous_rank=context.previous_rank,
                                        options=dict(options.get("inner_options", {})),
                                        checkpoint_url=context.checkpoint_url)
        self.inner: CheckpointStrategy = _inner_class(options["inner"])(inner_context)
        self.target = target_of(context.checkpoint_dir, context.checkpoint_url)
        self.manifests = self.target.join(self.target.root, MANIFEST_DIR)

    def prepare(self, workload: Workload) -> Workload:
        return self.inner.prepare(workload)

    # -- the inner's capabilities, forwarded (``capabilities_for`` says which it has) ---------------
    def tag_for(self, step: int) -> str:
        return self.inner.tag_for(step)

    def in_flight_steps(self) -> list[int]:
        return self.inner.in_flight_steps()

    # -- save -------------------------------------------------------------------------------------
    def save(self, workload: Workload, step: int) -> None:
        self.inner.save(workload, step)
        dist.barrier()  # every rank's files exist
        location = self.inner.step_location(step)
        locations: list[str | None] = [None] * self.context.world_size
        dist.all_gather_object(locations, str(location))
        if len(set(locations)) > 1:  # a manifest over one rank's directory would vouch for a partial checkpoint
            raise RuntimeError(f"manifest: ranks saved step {step} to different places: "
                               + ", ".join(f"rank {r}: {where}" for r, where in enumerate(locations)))
        target = self.target
        names = target.files_under(location)
        mine = {name: target.digest(target.join(location, name), durable=True) for name in self._share(names)}
        gathered: list[dict | None] = [None] * self.context.world_size
        dist.all_gather_object(gathered, mine)  # also: every rank's share is durable
        if self.context.rank == 0:
            files = {name: {"size": size, "sha256": sha} for part in gathered for name, (size, sha) in part.items()}
            target.make_durable(location)
            document = {"format": MANIFEST_FORMAT, "step": step, "world_size": self.context.world_size,
                        "location": target.relative(location), "files": dict(sorted(files.items()))}
            target.write_document(self._manifest_path(step), json.dumps(document, indent=1))
            self._prune(self.context.options.get("keep_last"))
        dist.barrier()

    def _prune(self, keep: int | None) -> None:
        """Retention done after the new manifest is durable: forget (manifest first, so a crash
        in between leaves files without a claim, never a claim without files) then delete all but
        the ``keep`` newest complete checkpoints."""
        if keep is None:
            return
        steps = self._listed()
        kept = {self._read_manifest(step).get("location") for step in steps[:keep]}
        for step in steps[keep:]:
            document = self._read_manifest(step)
            self.target.remove(self._manifest_path(step))
            if isinstance(document, dict) and document["location"] not in kept:
                self.target.remove_tree(self.target.join(self.target.root, document["location"]))

    def _share(self, names: list[str]) -> list[str]:
        return names[self.context.rank::self.context.world_size]

    # -- load -------------------------------------------------------------------------------------
    def load(self, workload: Workload) -> None:
        steps = [self._listed() if self.context.rank == 0 else None]
        dist.broadcast_object_list(steps, src=0)
        failures = []
        for step in steps[0]:
            document = [self._read_manifest(step) if self.context.rank == 0 else None]
            dist.broadcast_object_list(document, src=0)
            problems = [document[0]] if isinstance(document[0], str) else self._verify(document[0])
            gathered: list[list[str] | None] = [None] * self.context.world_size
            dist.all_gather_object(gathered, problems)
            found = sorted({p for part in gathered for p in part})
            if not found:
                if failures:
                    print(f"manifest: restoring step {step}; newer checkpoints failed verification: "
                          + " | ".join(failures), file=sys.stderr, flush=True)
                self.inner.load_step(workload, step)
                return
            failures.append(f"step {step}: " + "; ".join(found[:8]))
        if failures:
            raise RuntimeError("manifest: no checkpoint verifies against its manifest: " + " | ".join(failures))
        dist.barrier()  # nothing was ever completely saved: start from scratch

    def _manifest_path(self, step: int) -> Path | str:
        return self.target.join(self.manifests, f"step_{step:08d}.json")

    def _listed(self) -> list[int]:
        found = (MANIFEST_NAME.match(name) for name in self.target.entries(self.manifests))
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def _read_manifest(self, step: int) -> dict | str:
        name = f"step_{step:08d}.json"
        try:
            document = json.loads(self.target.read_text(self._manifest_path(step)))
        except (OSError, ValueError) as exc:
            return f"{name} unreadable ({type(exc).__name__}: {exc})"
        if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT or document.get("step") != step:
            return f"{name} is not a format-{MANIFEST_FORMAT} manifest of step {step}"
        return document

    def _verify(self, document: dict) -> list[str]:
        """This rank's share of the files that do not match the manifest. What is said of a file
        depends only on whether it is the file the manifest describes (missing or unreadable,
        another size, other bytes): nothing else of its bytes reaches the restore
        (`core.file_comparison`: a restore explored after a power cut is seen to compare)."""
        target = self.target
        location = target.join(target.root, document["location"])
        problems = []
        for name in self._share(sorted(document["files"])):
            expected = document["files"][name]
            path = target.join(location, name)
            with comparing(path, expected["size"], expected["sha256"]):
                try:
                    if target.size(path) != expected["size"]:
                        problems.append(f"{document['location']}/{name}: not the {expected['size']} bytes "
                                        "the manifest says")
                        continue
                    _, sha = target.digest(path)
                except OSError as exc:
                    problems.append(f"{document['location']}/{name}: {type(exc).__name__}: {exc}")
                    continue
            if sha != expected["sha256"]:
                problems.append(f"{document['location']}/{name}: sha256 is not the manifest's "
                                f"{expected['sha256'][:12]}...")
        return problems
