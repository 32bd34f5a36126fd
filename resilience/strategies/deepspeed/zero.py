"""DeepSpeed ZeRO stages 1, 2 and 3 as systems under test: the real engine trains the workload and
writes and reads its own checkpoints (``save_checkpoint`` / ``load_checkpoint`` and the ``latest``
tag file). Faults reach its files through the interception layer like anyone else's.

DeepSpeed is an optional extra (``pip install 'resilience[deepspeed]'``); this module imports it
only inside rank processes, so the harness and the scenario loader work without it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from ...core.capabilities import Capability
from ...workloads.base import TrainableWorkload, Workload
from ..base import CheckpointStrategy, StrategyContext
from .engine import ZeroTrainedWorkload, deepspeed_version, import_deepspeed, start_engine, training_config

UNIVERSAL_DIR = "universal"  # where the universal route writes its converted checkpoint
RESTORE_ROUTES = ("native", "universal")
WRITERS = ("torch", "decoupled")
# DeepSpeed's decoupled writer: a helper process per rank (started with the spawn method) writes
# the files while training goes on; `latest` is written when the save is committed, at the next
# optimizer step. "data_parallel" must be given (without it: AttributeError 'dp_rank').
DECOUPLED_WRITER = {"type": "python", "decoupled": True, "data_parallel": "replica"}
CONVERT_TIMEOUT_S = 600
TAG_VALIDATION = ("Warn", "Ignore", "Fail")  # DeepSpeed's checkpoint.tag_validation; its default: Warn


def checkpoint_classes() -> list[type]:
    """The classes DeepSpeed pickles into its ZeRO-1/2/3 checkpoint files besides tensors and
    containers (``torch.serialization.get_unsafe_globals_in_checkpoint`` on each of them):
    allowed by name, so its files load with ``weights_only=True`` and nothing else in them runs."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def load_weights_only(path) -> Any:
    """One of DeepSpeed's checkpoint files, read by our own code without full unpickling (DeepSpeed's
    own ``load_checkpoint`` unpickles in full: ``TorchCheckpointEngine.load``)."""
    with torch.serialization.safe_globals(checkpoint_classes()):
        return torch.load(path, weights_only=True)


def stamp_version(path, version: str) -> None:
    """Rewrite ``ds_version`` in one of DeepSpeed's checkpoint files, at the top level and in the
    optimizer state, where DeepSpeed reads it."""
    state = load_weights_only(path)
    for holder in (state, *(v for v in state.values() if isinstance(v, dict))):
        if "ds_version" in holder:
            holder["ds_version"] = version
    torch.save(state, path)


class ZeroCheckpoint(CheckpointStrategy):
    """``engine.save_checkpoint(dir, tag="global_stepN", client_state=...)`` on every rank after a
    checkpoint step, and ``engine.load_checkpoint(dir)`` at restart, which follows ``latest``.

    The workload's step, data position and randomness travel as DeepSpeed client state. Options:
    ``restore: native`` (default) loads the checkpoint as saved, which needs the same data-parallel
    size; ``restore: universal`` converts it first with ``deepspeed.checkpoint.ds_to_universal``
    (rank 0, under ``<checkpoint_dir>/universal``) and loads that with ``load_universal``, the
    route DeepSpeed offers for a changed topology. ``tag_validation: Warn|Ignore|Fail`` sets
    DeepSpeed's check that every rank passed the same tag (its default, Warn, only logs).
    ``writer: decoupled`` saves through DeepSpeed's
    decoupled checkpoint engine (a spawned writer process per rank; ``save_checkpoint`` returns
    before the files exist and ``latest`` follows at the next optimizer step); the restart loads
    with the torch engine, since the decoupled engine cannot load DeepSpeed's own pickles.
    """

    stage: ClassVar[int] = 0
    options = ("restore", "writer", "tag_validation")
    requires = {"deepspeed": "DS_BUILD_OPS=0 pip install 'resilience[deepspeed]'"}
    option_values: ClassVar[Mapping[str, tuple[str, ...]]] = {"restore": RESTORE_ROUTES, "writer": WRITERS,
                                                              "tag_validation": TAG_VALIDATION}
    capabilities = frozenset({Capability.TAGS, Capability.VERSION_STAMP, Capability.CHOSEN_STEP})

    @classmethod
    def capabilities_for(cls, options: Mapping[str, Any]) -> frozenset[Capability]:
        """``restore: universal`` converts what ``latest`` names: it cannot load a chosen step."""
        if options.get("restore", "native") == "universal":
            return cls.capabilities - {Capability.CHOSEN_STEP}
        return cls.capabilities

    def __init__(self, context: StrategyContext):
        super().__init__(context)
        self.restore = context.options.get("restore", "native")  # validated by the loader
        self.writer = context.options.get("writer", "torch")
        self.workload: ZeroTrainedWorkload | None = None
        self.recorded_check_loss: float | None = None

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return f"deepspeed-{deepspeed_version()}-zero{cls.stage}"

    @classmethod
    def workload_options(cls, options: Mapping[str, Any]) -> frozenset[str] | None:
        """The engine takes one batch a step (no ``accumulation``) in full precision (its own fp16
        needs CUDA: no ``amp``), and the trusted state this wrapper reads and restores holds
        parameters only (no ``buffers``); ZeRO-3 keeps each parameter partitioned in the module,
        so the weights' average (``ema``) cannot read them whole."""
        carried = {"dropout", "data", "num_workers", "persistent_workers", "epoch_steps", "loader_state", "ema", "tied"}
        return frozenset(carried - {"ema"} if cls.stage == 3 else carried)

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        """This class and the engine's workload: the training step lives beside it."""
        return (cls, ZeroTrainedWorkload)

    def prepare(self, workload: Workload) -> Workload:
        if not isinstance(workload, TrainableWorkload):
            raise TypeError(f"DeepSpeed trains a TrainableWorkload; {type(workload).__name__} is not one")
        context = self.context
        import_deepspeed(context.rank, context.world_size)
        config = {**training_config(workload.spec, context.world_size, self.stage),
                  "checkpoint": {"load_universal": self.restore == "universal" and context.previous_rank is not None}}
        if "tag_validation" in context.options:
            config["checkpoint"]["tag_validation"] = context.options["tag_validation"]
        if self.writer == "decoupled" and context.previous_rank is None:
            # Saving only: the decoupled engine's own load calls torch.load with weights_only
            # and refuses DeepSpeed's pickled objects, so a restart loads with the torch engine.
            config["checkpoint"]["writer"] = dict(DECOUPLED_WRITER)
            os.environ.setdefault("CROSS_RANK", "0")  # set by DeepSpeed's own launcher only
            os.environ.setdefault("CROSS_SIZE", "1")
        self.workload = start_engine(workload, config, self.stage)
        return self.workload

    def tag_for(self, step: int) -> str:
        """The tag this rank passes to ``save_checkpoint`` for ``step`` (every rank must agree)."""
        return f"global_step{step}"

    def save(self, workload: Workload, step: int) -> None:
        self.workload.engine.save_checkpoint(str(self.context.checkpoint_dir), tag=self.tag_for(step),
                                             client_state={"progress": self.workload.inner.progress_state(),
                                                           "check_loss": self.workload.evaluation_loss()})

    CLAIMED_DS_VERSIONS: ClassVar[Mapping[str, str]] = {"older": "0.3.0", "newer": "99.0.0"}

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        """``ds_version`` (`stamp_version`) in this rank's files of the tag: its shards; rank 0 also
        the shared model states."""
        rank, root = self.context.rank, self.context.checkpoint_dir
        changed = []
        for path in sorted((root / f"global_step{step}").glob("*.pt")):
            if not (f"zero_pp_rank_{rank}_" in path.name or (rank == 0 and path.name.startswith("mp_rank_"))):
                continue
            stamp_version(path, self.CLAIMED_DS_VERSIONS[claim])
            changed.append(path.relative_to(root).as_posix())
        return changed

    def finish(self, workload: Workload) -> None:
        """A job with the decoupled writer ends as DeepSpeed ends one: ``engine.destroy()`` commits the
        last save and joins the writer (DeepSpeed 0.19.8 ``runtime/engine.py:1262-1264`` ->
        ``DecoupledCheckpointEngine.cleanup``). Without it the rank's exit raced its writer still
        receiving the last state: an ``EOFError`` in the writer, or the save silently never committed."""
        # only the saving writer: a restart may run a DeepSpeed release older than is_decoupled (0.16.0)
        checkpoint_engine = getattr(self.workload.engine, "checkpoint_engine", None)
        if self.writer == "decoupled" and getattr(checkpoint_engine, "is_decoupled", lambda: False)():
            self.workload.engine.destroy()

    def load(self, workload: Workload) -> None:
        load_dir = self.context.checkpoint_dir
        if self.restore == "universal":
            load_dir = self._convert_to_universal()
        path, client_state = self.workload.engine.load_checkpoint(str(load_dir))
        if path is None:  # DeepSpeed found no checkpoint (it only warns): training starts over
            return
        self.workload.inner.load_progress_state(client_state["progress"])
        self.recorded_check_loss = client_state.get("check_loss")  # for resilience verify --step-check

    def step_location(self, step: int):
        return self.context.checkpoint_dir / self.tag_for(step)

    def load_step(self, workload: Workload, step: int) -> None:
        """``load_checkpoint(dir, tag=...)``: the tag named, whatever ``latest`` says (native route)."""
        if self.restore == "universal":
            raise NotImplementedError("restore: universal converts what latest names; "
                                      "a chosen step needs restore: native")
        path, client_state = self.workload.engine.load_checkpoint(str(self.context.checkpoint_dir),
                                                                  tag=self.step_location(step).name)
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint under tag {self.step_location(step).name}")
        self.workload.inner.load_progress_state(client_state["progress"])

    def _convert_to_universal(self):
        """Rank 0 converts the checkpoint ``latest`` names; the others wait for it."""
        source = self.context.checkpoint_dir
        target = source / UNIVERSAL_DIR
        if self.context.rank == 0:
            latest = source / "latest"
            if latest.exists():
                tag = latest.read_text().strip()
                command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                           "--input_folder", str(source / tag), "--output_folder", str(target / tag),
                           "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"]
                done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S)
                if done.returncode:
                    raise RuntimeError(f"ds_to_universal failed with exit status {done.returncode}: "
                                       f"{(done.stdout + done.stderr)[-2000:]}")
                (target / "latest").write_text(tag)
        dist.barrier()
        return target


class Zero1(ZeroCheckpoint):
    stage = 1


class Zero2(ZeroCheckpoint):
    stage = 2


class Zero3(ZeroCheckpoint):
    stage = 3
