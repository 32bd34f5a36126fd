"""GEMINI (SOSP'23) as lm-resiliency 0.2.0 builds it: ``InMemoryCheckpointManager``
(``lm_resiliency/checkpointing/manager.py``) in every rank.

A save copies the rank's state into its own CPU memory (``save``, manager.py:333-352: a slot in the
process's heap, ``buffer.py:106-114``), then a background thread swaps it over gloo with the peer
``replication_jump`` ranks away (replication.py:267-281, every rank pairs with rank ± J), so each
rank holds its own state and its peer's. The memory lives and dies with the process: nothing goes
to ``/dev/shm``. What makes a restart possible is the flush of a failed process: on SIGTERM and at
the exit that follows an uncaught exception (its ``atexit`` handler, manager.py:1180-1222), a
survivor writes its own state and its peer's replica to the node-local folder
(``flush_for_restart``, manager.py:1036-1143; files written by rename and fsync, disk.py:80-151). A
restarted rank builds a new manager with the same run id and calls ``load(LATEST_GEMINI)``
(manager.py:617-672): the newest step every rank holds, in memory (never, in a fresh process) or in
the folder; None when some rank has none: the script then starts over (GEMINI leaves a durable
tier to the training framework).

The same handler also runs at a normal exit (every save arms it until ``close()``, which a script
may never call): the job's end flushes too. A rank of the harness ends with ``os._exit``, which
skips ``atexit``: ``at_exit`` calls the same flush, and survivors of a failure get 30 s for it
(``failure_grace_s``, as torchrun's agent waits after its SIGTERM). The folder is the rank's
checkpoint directory: its node's own where the topology gives nodes local storage, so a lost node
loses the replicas it held.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ...workloads.base import Workload
from ..base import CheckpointStrategy
from . import PACKAGES

RUN_ID = "resilience"  # one run across the case's launches: a relaunch may recover its files (manager.py:203-225)


class GeminiCheckpoint(CheckpointStrategy):
    """Options: ``replication_jump`` (J: rank r's replica is on rank r ± J; default: the ranks per
    node, as lm-resiliency's auto-detection counts one node's GPUs, so replicas sit on another node;
    1 where the ranks do not split into pairs of nodes: one node, an odd number of nodes),
    ``verify_integrity`` (CRC-32 per shard on disk, checked at load; default true)."""

    options = ("replication_jump", "verify_integrity")
    option_values: ClassVar[Mapping[str, Any]] = {"replication_jump": int, "verify_integrity": (True, False)}
    layered_packages = PACKAGES
    failure_grace_s = 30.0

    def __init__(self, context):
        super().__init__(context)
        self.manager = None

    def _manager(self):
        """The manager, made on the first save or load (collective: every rank makes it at the same
        call); the reference and the oracle's runs, which neither save nor load, make none."""
        if self.manager is None:
            from lm_resiliency.checkpointing import InMemoryCheckpointManager, InMemoryCkptConfig

            options = self.context.options
            self.manager = InMemoryCheckpointManager(InMemoryCkptConfig(
                interval=1, replication_jump=options.get("replication_jump", self._default_jump()),
                disk_flush_interval=0, disk_folder=str(self.context.checkpoint_dir), run_id=RUN_ID,
                verify_integrity=options.get("verify_integrity", True), pin_memory=False))
        return self.manager

    def _default_jump(self) -> int:
        per_node, world = self.context.placement.ranks_per_node, self.context.world_size
        return per_node if world % (2 * per_node) == 0 else 1

    def save(self, workload: Workload, step: int) -> None:
        self._manager().save(workload.state_dict(), step)

    def finish(self, workload: Workload) -> None:
        self._manager().finalize_replication()

    def load(self, workload: Workload) -> None:
        from lm_resiliency.checkpointing import RecoveryMode

        found = self._manager().load(RecoveryMode.LATEST_GEMINI)
        if found is not None:  # None: nothing every rank holds; training starts over
            workload.load_state_dict(found[0])

    def at_exit(self, failed: bool) -> None:
        if self.manager is not None:  # its atexit handler (_flush_on_exit, manager.py:1212-1222)
            self.manager.flush_for_restart()
