"""torchtitan's checkpoint manager as the system under test: torchtitan 0.3.0's real
``CheckpointManager`` (``torchtitan/components/checkpointer/dcp.py``) saves and restores a tiny
Llama 3 that torchtitan builds and wraps with FSDP2 on gloo, its optimizer and LR scheduler
containers, its stateful dataloader and its train state, in a trimmed copy of the trainer's loop
(``loop.py``, which cites the trainer's lines). A restart calls ``load()``, which resumes from the
newest ``step-N`` folder holding a ``.metadata`` file (``dcp.py:640-684``).

Every phase runs with torchtitan layered over this environment (``layered_packages``); the
library is imported only in those ranks.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ...core.capabilities import Capability
from ...workloads.base import Workload
from ..base import CheckpointStrategy, TrainingObserver
from . import PACKAGES

ASYNC_MODES = ("disabled", "async")
EXPORT_DTYPES = ("float32", "bfloat16")


class TorchtitanCheckpoint(CheckpointStrategy):
    """torchtitan's ``[checkpoint]`` section, its keys as options: ``async_mode: disabled | async``
    (``async``: DCP's ``async_save`` in a thread, over a gloo group the manager makes;
    ``async_with_pinned_mem`` stages through pinned CUDA memory and is refused), ``keep_latest_k``
    (0: keep all, the default here; torchtitan refuses 1; rank 0 purges the older ``step-*``
    folders in a thread of its own right after each save is launched), ``last_save_model_only``
    (default true, as torchtitan's: the save at the job's last step writes the model alone, in
    ``export_dtype``), ``last_save_in_hf`` (that save as Hugging Face safetensors, through the llama3
    state-dict adapter), ``export_dtype: float32 | bfloat16``. ``interval`` is the workload's
    ``checkpoint_every``. ``token_masking: p`` replaces each input token with probability ``p`` by a
    draw from the process's torch generator, as dropout would: torchtitan checkpoints no RNG.
    The workload spec gives the steps, the seed and the global batch (each rank's
    ``local_batch_size`` is its share); the model and its data are the strategy's own."""

    drives_training = True
    options = ("async_mode", "keep_latest_k", "last_save_model_only", "last_save_in_hf", "export_dtype",
               "token_masking")
    option_values: ClassVar[Mapping[str, Any]] = {
        "last_save_model_only": (True, False), "last_save_in_hf": (True, False), "export_dtype": EXPORT_DTYPES}
    layered_packages = PACKAGES
    capabilities = frozenset({Capability.CHOSEN_STEP})

    @staticmethod
    def check_options(options: Mapping[str, Any]) -> tuple[str, str, Any, Any] | None:
        mode = options.get("async_mode", "disabled")
        if mode == "async_with_pinned_mem":
            return ("strategy.options.async_mode", "stages through pinned CUDA memory (DefaultStager with "
                    "use_non_blocking_copy, checkpointer/dcp.py:426-433), which a CPU cannot give", mode, ASYNC_MODES)
        if mode not in ASYNC_MODES:
            return ("strategy.options.async_mode", "not one of the allowed values", mode, ASYNC_MODES)
        if options.get("last_save_in_hf") and not options.get("last_save_model_only", True):
            return ("strategy.options.last_save_in_hf", "exports the model alone (torchtitan asserts it, "
                    "checkpointer/dcp.py:762-765): it needs last_save_model_only true", True, (False,))
        keep = options.get("keep_latest_k", 0)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0 or keep == 1:
            return ("strategy.options.keep_latest_k", "must be 0 (keep every checkpoint) or at least 2 (torchtitan "
                    "refuses 1: components/checkpointer/base.py:282)", keep, "0, 2, 3, ...")
        masking = options.get("token_masking", 0)
        if isinstance(masking, bool) or not isinstance(masking, (int, float)) or not 0 <= masking < 1:
            return ("strategy.options.token_masking", "must be a probability below 1", masking, "0 <= p < 1")
        return None

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return f"torchtitan-{PACKAGES[0].split('==')[1]}-masking-{float(options.get('token_masking', 0))}"

    def prepare(self, workload: Workload) -> Workload:
        from . import cpu

        cpu.install()  # before the engine imports torchtitan's models and parallel code
        from .engine import TitanTrainedWorkload

        spec = workload.spec
        if spec.global_batch % self.context.world_size:
            raise ValueError(f"global batch {spec.global_batch} is not divisible by world size "
                             f"{self.context.world_size}")
        self.workload = TitanTrainedWorkload(spec, workload.rank, workload.world_size,
                                             float(self.context.options.get("token_masking", 0)))
        return self.workload

    def train(self, workload: Workload, observer: TrainingObserver) -> None:
        from .loop import train

        train(self.workload, observer, str(self.context.checkpoint_dir), dict(self.context.options))

    def step_location(self, step: int) -> Path | None:
        return Path(self.context.checkpoint_dir) / "checkpoint" / f"step-{step}"

    def save(self, workload: Workload, step: int) -> None:
        raise NotImplementedError("torchtitan's checkpoint manager saves inside its training loop")

    def load(self, workload: Workload) -> None:
        raise NotImplementedError("torchtitan's checkpoint manager restores inside its training loop (load())")

    def load_step(self, workload: Workload, step: int) -> None:
        raise NotImplementedError("torchtitan's checkpoint manager restores a chosen step inside its training "
                                  "loop (load(step))")
