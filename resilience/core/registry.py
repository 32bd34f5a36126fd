"""Resolve the names a scenario uses to plug-in classes: built-in names or `package.module:Class`."""
from __future__ import annotations

import importlib
import re

from ..errors import PluginError

STRATEGIES = {
    "none": "resilience.strategies.noop:NoCheckpoint",
    "torch.rank0": "resilience.strategies.torch.native:RankZeroSave",
    "torch.per_rank": "resilience.strategies.torch.native:PerRankSave",
    "deepspeed.zero1": "resilience.strategies.deepspeed.zero:Zero1",
    "deepspeed.zero2": "resilience.strategies.deepspeed.zero:Zero2",
    "deepspeed.zero3": "resilience.strategies.deepspeed.zero:Zero3",
    "megatron": "resilience.strategies.megatron.lm:MegatronCheckpoint",
    "megatron_core": "resilience.strategies.megatron.core_checkpoint:MegatronCoreCheckpoint",
    "megatron_deepspeed": "resilience.strategies.megatron.with_deepspeed:MegatronDeepSpeed",
    "dcp": "resilience.strategies.torch.dcp:DcpCheckpoint",
    "manifest": "resilience.strategies.manifest:ManifestCheckpoint",
    "lightning": "resilience.strategies.lightning.strategy:LightningCheckpoint",
    "accelerate": "resilience.strategies.accelerate.strategy:AccelerateCheckpoint",
    "hf_trainer": "resilience.strategies.transformers.strategy:TrainerCheckpoint",
    "torchtitan": "resilience.strategies.torchtitan.strategy:TorchtitanCheckpoint",
    "dlrover_flash": "resilience.strategies.dlrover.flash:FlashCheckpoint",
    "gemini": "resilience.strategies.gemini.checkpoint:GeminiCheckpoint",
}
FAULTS = {
    "none": "resilience.faults.noop:NoFault",
    "kill": "resilience.faults.process.kill:Kill",
    "disk_full": "resilience.faults.write_path.disk_full:DiskFull",
    "stall": "resilience.faults.process.stall:Stall",
    "partition": "resilience.faults.network.partition:Partition",
    "throttle": "resilience.faults.network.partition:Throttle",
    "preempt": "resilience.faults.process.preempt:Preempt",
    "version_mismatch": "resilience.faults.at_rest.version:VersionMismatch",
    "power_loss": "resilience.faults.write_path.power_loss:PowerLoss",
    "bit_flip": "resilience.faults.at_rest.corruption:BitFlip",
    "truncate": "resilience.faults.at_rest.corruption:Truncate",
    "zero_block": "resilience.faults.at_rest.corruption:ZeroBlock",
    "missing_file": "resilience.faults.at_rest.corruption:MissingFile",
    "duplicate_file": "resilience.faults.at_rest.misplaced:DuplicateFile",
    "stale_pointer": "resilience.faults.at_rest.misplaced:StalePointer",
    "malicious_pickle": "resilience.faults.at_rest.hostile:MaliciousPickle",
    "read_error": "resilience.faults.at_rest.storage:ReadError",
    "slow_read": "resilience.faults.at_rest.storage:SlowRead",
    "read_only": "resilience.faults.at_rest.storage:ReadOnly",
    "straggler": "resilience.faults.at_rest.straggler:Straggler",
    "tag_mismatch": "resilience.faults.write_path.disagreement:TagMismatch",
    "crash": "resilience.faults.write_path.crash:Crash",
    "gil_hang": "resilience.faults.process.gil_hang:GilHang",
    "collective_failure": "resilience.faults.network.collective:CollectiveFailure",
    "overlapping_async": "resilience.faults.write_path.overlapping:OverlappingAsync",
    "s3": "resilience.faults.network.s3:ObjectStoreFault",
    "node_loss": "resilience.faults.process.node_loss:NodeLoss",
}
#: the stack packages: each declares its libraries in ``STACK`` (`resilience.strategies.stack.Stack`)
STACKS = tuple(f"resilience.strategies.{name}"
               for name in ("torch", "deepspeed", "megatron", "lightning", "accelerate", "transformers", "torchtitan",
                                "dlrover", "gemini"))
WORKLOADS = {
    "mlp": "resilience.workloads.mlp:MLPWorkload",
    "tp_mlp": "resilience.workloads.parallel_mlp:TensorParallelMLP",
}
TABLES = {"strategy": STRATEGIES, "fault": FAULTS, "workload": WORKLOADS}
BASES = {
    "strategy": "resilience.strategies.base:CheckpointStrategy",
    "fault": "resilience.faults.base:Fault",
    "workload": "resilience.workloads.base:Workload",
}
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_import_path(name: str) -> bool:
    return bool(IMPORT_PATH.match(name))


def _import(target: str):
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def resolve(kind: str, name: str) -> type:
    """The class for `name`: a built-in name of this kind or `package.module:Class` (a subclass of the base)."""
    table = TABLES[kind]
    if name in table:
        return _import(table[name])
    if not is_import_path(name):
        raise PluginError(f"unknown {kind} {name!r}; allowed: {', '.join(table)} or package.module:Class")
    try:
        cls = _import(name)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"cannot import {kind} {name!r}: {type(exc).__name__}: {exc}") from exc
    base = _import(BASES[kind])
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PluginError(f"{kind} {name!r} is not a subclass of {base.__module__}.{base.__name__}")
    return cls
