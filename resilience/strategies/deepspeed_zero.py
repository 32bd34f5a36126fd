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
from importlib import metadata
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from ..workloads.mlp import TrainableWorkload, Workload
from .base import CheckpointStrategy, StrategyContext

UNIVERSAL_DIR = "universal"  # where the universal route writes its converted checkpoint
RESTORE_ROUTES = ("native", "universal")
WRITERS = ("torch", "decoupled")
# DeepSpeed's decoupled writer: a helper process per rank (started with the spawn method) writes
# the files while training goes on; `latest` is written when the save is committed, at the next
# optimizer step. "data_parallel" must be given (without it: AttributeError 'dp_rank').
DECOUPLED_WRITER = {"type": "python", "decoupled": True, "data_parallel": "replica"}
ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")
CONVERT_TIMEOUT_S = 600
TAG_VALIDATION = ("Warn", "Ignore", "Fail")  # DeepSpeed's checkpoint.tag_validation; its default: Warn


def deepspeed_version() -> str | None:
    try:
        return metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return None


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


def without_shared_memory_comm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory all-reduce op at engine start.

    The op serves only ``inference_all_reduce`` (and only with LOCAL_SIZE set), never a checkpoint;
    but its build runs in every fresh rank under torch's cpp_extension lock file, and a rank killed
    during the build (a fault, a teardown) leaves that lock behind: every later DeepSpeed process
    on the machine then waits for it forever (seen here). The build is skipped, not the library.
    """
    import sys

    comm = sys.modules.get("deepspeed.comm.torch")
    if comm is not None:
        comm.build_shm_op = lambda: None


class ZeroTrainedWorkload(Workload):
    """A `TrainableWorkload` whose steps a DeepSpeed engine computes.

    Its ``state_dict`` (what fingerprints and trusted snapshots see) is free of the topology: full
    fp32 parameters and Adam moments assembled from the ZeRO partitions with DeepSpeed's
    ``safe_get_full_*`` API, so a state compares bitwise across world sizes. ``state_dict`` and
    ``load_state_dict`` are collective: every rank calls them together.
    """

    def __init__(self, inner: TrainableWorkload, engine: Any, stage: int):
        super().__init__(inner.spec, inner.rank, inner.world_size)
        self.inner, self.engine, self.stage = inner, engine, stage
        self.rank_local_keys = inner.rank_local_keys
        self._adam = engine.optimizer.optimizer  # the client optimizer, now over flat partitions

    @property
    def step(self) -> int:
        return self.inner.step

    def train_step(self) -> float:
        inputs, targets = self.inner.next_local_batch()
        loss = self.inner.local_loss(self.engine(inputs), targets)
        self.engine.backward(loss)
        self.engine.step()
        self.inner.count_step()
        total = loss.detach().clone().reshape(1)
        dist.all_reduce(total)
        return float(total[0]) / self.world_size

    def _adam_step(self) -> float | None:
        """Adam's step count, once its state exists; then the moments are reachable per parameter."""
        steps = {float(state["step"]) for state in self._adam.state.values() if "step" in state}
        if len(steps) != 1:
            return None
        # ZeRO 1/2 link each parameter to its slice of the moments lazily, in their next step, so
        # right after load_checkpoint safe_get_full_optimizer_state fails (TypeError) until linked
        link = getattr(self.engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:
            link()
        return steps.pop()

    def state_dict(self) -> dict[str, Any]:
        from deepspeed.utils import (
            safe_get_full_fp32_param,
            safe_get_full_optimizer_state,
        )

        parameters = list(self.engine.module.named_parameters())
        state = {**self.inner.progress_state(),
                 "model": {name: safe_get_full_fp32_param(p).detach().clone() for name, p in parameters},
                 "scheduler": self.inner.scheduler.state_dict(), "optimizer": {}}
        adam_step = self._adam_step()
        if adam_step is not None:  # Adam creates its moments at the first step
            state["optimizer"] = {key: {name: safe_get_full_optimizer_state(p, key).detach().clone()
                                        for name, p in parameters} for key in ADAM_MOMENTS}
            state["optimizer"]["step"] = adam_step
        return state

    def evaluation_loss(self) -> float | None:
        """The inner workload's evaluation loss under the full parameters, recorded at save time as
        client state (for `resilience verify --step-check`). ZeRO-1/2 keep every parameter whole on
        every rank: no collective. ZeRO-3 would have to gather its partitions, collectives that
        DeepSpeed's own save does not make and that would move where a stalled or partitioned peer
        is first noticed: it records nothing."""
        if self.stage == 3:
            return None
        return self.inner.evaluation_loss({name: p.detach() for name, p in self.engine.module.named_parameters()})

    def rank_local_state(self) -> dict[str, Any]:
        return self.inner.progress_state()  # state_dict() is collective; a rank new to the job calls this alone

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The trusted restore of a reference snapshot, through DeepSpeed's public parameter API
        only: never through a DeepSpeed checkpoint, which is what is under test."""
        from deepspeed.utils import (
            safe_set_full_fp32_param,
            safe_set_full_optimizer_state,
        )

        if state["optimizer"] and self._adam_step() is None:
            self.train_step()  # Adam and ZeRO create their state tensors; everything is overwritten below
        for name, parameter in self.engine.module.named_parameters():
            value = state["model"][name]
            self._set_full(parameter, value, None, safe_set_full_fp32_param)
            self._set_module_parameter(parameter, value)
            for key in ADAM_MOMENTS if state["optimizer"] else ():
                self._set_full(parameter, state["optimizer"][key][name], key, safe_set_full_optimizer_state)
        if state["optimizer"]:
            for adam_state in self._adam.state.values():
                adam_state["step"].fill_(state["optimizer"]["step"])
        self.inner.scheduler.load_state_dict(state["scheduler"])
        for group, lr in zip(self._adam.param_groups, self.inner.scheduler.get_last_lr()):
            group["lr"] = lr
        self.inner.load_progress_state(state)
        self.engine.global_steps = self.inner.step
        self.engine.global_samples = self.inner.step * self.engine.train_batch_size()

    def _set_full(self, parameter, value: torch.Tensor, key: str | None, set_full) -> None:
        """safe_set_full_* for one parameter. ZeRO-3's narrows the value at partition * rank without
        the padding its partitions have, so a parameter whose size the world size does not divide
        fails ("start (1) + length (1) exceeds dimension size (1)"): set this rank's padded slice."""
        if self.stage != 3:
            set_full(parameter, value) if key is None else set_full(parameter, value, key)
            return
        from deepspeed.utils import (
            safe_set_local_fp32_param,
            safe_set_local_optimizer_state,
        )

        size = parameter.ds_tensor.numel()
        padded = torch.zeros(size * self.world_size, dtype=value.dtype)
        padded[:value.numel()] = value.reshape(-1)
        local = padded.narrow(0, size * self.rank, size)
        if key is None:
            safe_set_local_fp32_param(parameter, local)
        else:
            safe_set_local_optimizer_state(parameter, local, key)

    def _set_module_parameter(self, parameter: torch.nn.Parameter, value: torch.Tensor) -> None:
        """The copy the forward pass reads (ZeRO-3 keeps only a partition of it on each rank)."""
        if self.stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([parameter], modifier_rank=0):
                if self.rank == 0:
                    parameter.data.copy_(value)
        else:
            parameter.data.copy_(value)


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

    def __init__(self, context: StrategyContext):
        super().__init__(context)
        self.restore = context.options.get("restore", "native")  # validated by the loader
        self.writer = context.options.get("writer", "torch")
        self.workload: ZeroTrainedWorkload | None = None
        self.recorded_check_loss: float | None = None

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return f"deepspeed-{deepspeed_version()}-zero{cls.stage}"

    def prepare(self, workload: Workload) -> Workload:
        if not isinstance(workload, TrainableWorkload):
            raise TypeError(f"DeepSpeed trains a TrainableWorkload; {type(workload).__name__} is not one")
        context = self.context
        for name, value in (("RANK", context.rank), ("LOCAL_RANK", context.rank),
                            ("WORLD_SIZE", context.world_size), ("LOCAL_WORLD_SIZE", context.world_size)):
            os.environ[name] = str(value)
        import deepspeed

        without_shared_memory_comm_op()
        spec = workload.spec
        config = {
            "train_batch_size": spec.global_batch,
            "train_micro_batch_size_per_gpu": spec.global_batch // context.world_size,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": self.stage},
            "steps_per_print": 1 << 30,
            "checkpoint": {"load_universal": self.restore == "universal" and context.previous_rank is not None},
        }
        if "tag_validation" in context.options:
            config["checkpoint"]["tag_validation"] = context.options["tag_validation"]
        if self.writer == "decoupled" and context.previous_rank is None:
            # Saving only: the decoupled engine's own load calls torch.load with weights_only
            # and refuses DeepSpeed's pickled objects, so a restart loads with the torch engine.
            config["checkpoint"]["writer"] = dict(DECOUPLED_WRITER)
            os.environ.setdefault("CROSS_RANK", "0")  # set by DeepSpeed's own launcher only
            os.environ.setdefault("CROSS_SIZE", "1")
        engine, _, _, _ = deepspeed.initialize(model=workload.model, optimizer=workload.optimizer,
                                               lr_scheduler=workload.scheduler, config=config,
                                               dist_init_required=False)
        self.workload = ZeroTrainedWorkload(workload, engine, self.stage)
        return self.workload

    def tag_for(self, step: int) -> str:
        """The tag this rank passes to ``save_checkpoint`` for ``step`` (every rank must agree)."""
        return f"global_step{step}"

    def save(self, workload: Workload, step: int) -> None:
        self.workload.engine.save_checkpoint(str(self.context.checkpoint_dir), tag=self.tag_for(step),
                                             client_state={"progress": self.workload.inner.progress_state(),
                                                           "check_loss": self.workload.evaluation_loss()})

    records_version = True
    CLAIMED_DS_VERSIONS: ClassVar[Mapping[str, str]] = {"older": "0.3.0", "newer": "99.0.0"}

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        """``ds_version`` in this rank's files of the tag (its shards; rank 0 also the shared
        model states), at the top level and in the optimizer state, where DeepSpeed reads it."""
        rank, root = self.context.rank, self.context.checkpoint_dir
        changed = []
        for path in sorted((root / f"global_step{step}").glob("*.pt")):
            if not (f"zero_pp_rank_{rank}_" in path.name or (rank == 0 and path.name.startswith("mp_rank_"))):
                continue
            state = load_weights_only(path)
            for holder in (state, *(v for v in state.values() if isinstance(v, dict))):
                if "ds_version" in holder:
                    holder["ds_version"] = self.CLAIMED_DS_VERSIONS[claim]
            torch.save(state, path)
            changed.append(path.relative_to(root).as_posix())
        return changed

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
            raise NotImplementedError("restore: universal converts what latest names; a chosen step needs restore: native")
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
