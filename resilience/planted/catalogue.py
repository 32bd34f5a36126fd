"""Which case catches which planted bug.

A *catcher* is a scenario (everything but the strategy) and the verdicts any correct strategy may
give in it. Running a strategy in a catcher *catches* it when its verdict is not one of those (SILENT
and HANG never are), and says nothing when the fault never fired (the strategy's files did not
match what the fault looks for). Each planted bug names its catcher and a *control*: a correct
strategy of the same shape, which the same catcher must accept, so that a catch means the bug and
not a case that fails everything.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.case import VerdictKind

# where the planted strategies live (`package.module:` prefixes of their names)
TWIN, STATE_BUG, STORAGE_BUG, ASYNC_BUG = ("resilience.planted.durable:", "resilience.planted.state_bugs:",
                                           "resilience.planted.storage_bugs:", "resilience.planted.async_bugs:")
WORKLOAD_BUG = "resilience.planted.workload_bugs:"
TIMELINE_BUG = "resilience.planted.timeline_bugs:"
TIER_BUG = "resilience.planted.tier_bugs:"
RECOVERED, LOUD = VerdictKind.RECOVERED, VerdictKind.LOUD
TWO_RANKS = {"model": "mlp", "world_size": 2, "steps": 12, "checkpoint_every": 4, "seed": 0}
# the state of a real job: dropout on per-rank streams, an EMA, two micro-batches a step, fp16 with a
# loss scaler, running statistics, a tied layer, a DataLoader with two prefetching workers and
# 5-step epochs (a restore of step 8 resumes in the middle of epoch 1)
FULL_STATE = {"dropout": 0.1, "ema": 0.9, "accumulation": 2, "amp": "fp16", "buffers": True, "tied": True,
              "data": "loader", "num_workers": 2, "persistent_workers": True, "epoch_steps": 5}


@dataclass(frozen=True)
class Catcher:
    name: str
    summary: str
    document: Mapping[str, Any] = field(hash=False)  # a scenario document without strategy and expect
    accepts: frozenset[VerdictKind]  # what a correct strategy may give here
    fallback_ok: bool = False  # damage at rest: restoring an older checkpoint is right
    fallback_required: bool = False  # a LOUD refusal is caught when an older checkpoint was intact

    def scenario(self, strategy: Any, label: str) -> dict:
        """The scenario document of this catcher run with ``strategy`` (a name or a mapping)."""
        outcome = "fails_loudly" if LOUD in self.accepts else "recovers"
        return {**self.document, "name": f"{label} in {self.name}", "description": self.summary,
                "strategy": strategy, "expect": {"outcome": outcome, "fallback_ok": self.fallback_ok,
                           "fallback": "required" if self.fallback_required else "optional"}}


@dataclass(frozen=True)
class PlantedBug:
    name: str
    failure_mode: str  # the real failure it models
    strategy: str  # package.module:Class
    catcher: str  # a Catcher's name
    control: Any  # the correct twin: a strategy name, target or {name, options}


# Cheapest first: a strategy under audit meets them in this order. Phase deadlines leave room for a
# loaded machine and a forkserver that starts with the first case.
CATCHERS: tuple[Catcher, ...] = (
    Catcher("kill_in_training", "rank 1 SIGKILLed at step 10 (checkpoints at 4 and 8), per-rank RNG "
            "streams: the restart must resume from step 8 with every rank's own state",
            {"workload": {**TWO_RANKS, "rank_rng": "distinct"},
             "fault": {"kind": "kill", "rank": 1, "step": 10, "phase": "train"},
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED})),
    Catcher("second_resume", "three launches: rank 1 SIGKILLed at step 6, the restart (from step 4) saves step 8 "
            "and rank 0 is SIGKILLed at step 10, the third launch restores the restart's own step-8 save: a save "
            "made after a resume must be as good as the first run's",
            {"workload": {**TWO_RANKS, "rank_rng": "distinct"},
             "timeline": [{"fault": {"kind": "kill", "rank": 1, "step": 6, "phase": "train"}},
                          {"fault": {"kind": "kill", "rank": 0, "step": 10, "phase": "train"}}, {}],
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED})),
    Catcher("clean_exit", "no fault: the job ends at step 12, every rank exiting 0 after the step-12 save "
            "returned, and the restart must find that save (the last save of a job is never followed by a step); "
            "the saves of steps 4 and 8 are restored in fresh ranks right after the first run (verify_saves)",
            {"workload": TWO_RANKS, "fault": "none", "verify_saves": True, "timeouts": {"phase": 60}},
            frozenset({RECOVERED})),
    Catcher("full_state_kill", "rank 1 SIGKILLed between the two micro-batches of step 10 (checkpoints at 4 "
            "and 8) of a job with dropout on per-rank streams, an EMA of the weights, fp16 with a loss scaler and "
            "a DataLoader with two workers: the restart resumes mid-epoch and must restore all of it",
            {"workload": {**TWO_RANKS, "rank_rng": "distinct", "options": FULL_STATE},
             "fault": {"kind": "kill", "rank": 1, "step": 10, "phase": "train", "point": "micro_step"},
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED})),
    Catcher("two_nodes", "4 ranks on 2 nodes (shared storage), per-rank RNG streams, rank 1 killed at "
            "step 6: local and global ranks differ on node 1",
            {"workload": {**TWO_RANKS, "world_size": 4, "steps": 8, "rank_rng": "distinct"},
             "topology": {"nodes": 2},
             "fault": {"kind": "kill", "rank": 1, "step": 6, "phase": "train"},
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED, LOUD})),
    Catcher("fewer_ranks", "saved by 4 ranks, rank 3 killed at step 6, restarted on 2: the state must "
            "be resharded whole or refused",
            {"workload": {**TWO_RANKS, "world_size": 4, "steps": 8},
             "fault": {"kind": "kill", "rank": 3, "step": 6, "phase": "train"},
             "restart": {"world_size": 2}, "timeouts": {"phase": 60}},
            frozenset({RECOVERED, LOUD})),
    Catcher("torn_write", "rank 1 SIGKILLed 4 KiB into the first file it writes in the step-8 save",
            {"workload": TWO_RANKS,
             "fault": {"kind": "kill", "rank": 1, "step": 8, "point": "write", "after_bytes": 4096},
             "timeouts": {"phase": 30}},  # short: the hang planted here costs one deadline
            frozenset({RECOVERED, LOUD})),
    Catcher("disk_full", "ENOSPC 8 KiB into rank 1's first file of the step-8 save, the last step: the "
            "save must fail, or nothing may claim step 8 saved",
            {"workload": {**TWO_RANKS, "steps": 8},
             "fault": {"kind": "disk_full", "via": "quota", "rank": 1, "step": 8, "point": "write",
                       "after_bytes": 8192},
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED, LOUD})),
    Catcher("newer_version", "after the step-8 save every file claims a format newer than the reader "
            "knows: a correct reader refuses it",
            {"workload": TWO_RANKS, "fault": {"kind": "version_mismatch", "rank": 0, "step": 8,
                                              "version": "newer"},
             "timeouts": {"phase": 60}},
            frozenset({LOUD})),
    Catcher("foreign_shard", "after the step-8 save, each file rank 1 wrote in it is overwritten by rank 0's "
            "counterpart (per-rank RNG streams, so the two differ)",
            {"workload": {**TWO_RANKS, "rank_rng": "distinct"},
             "fault": {"kind": "duplicate_file", "rank": 1, "step": 8, "file": "@written_by:1",
                       "source": "@written_by:0"},
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED, LOUD}), fallback_ok=True),
    Catcher("hostile_pickle", "after the step-8 save, every pickle rank 1 wrote in it is rewritten to run a "
            "payload when unpickled (same state otherwise): the payload must never run",
            {"workload": TWO_RANKS,
             "fault": {"kind": "malicious_pickle", "rank": 1, "step": 8, "file": "@written_by:1"},
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED, LOUD}), fallback_ok=True),
    Catcher("stale_pointer", "after the step-8 save the pointer (the file every rank reads first at restore, "
            "whatever its name) is set back to step 4 (an update that never reached the disk); step 8 is "
            "complete on disk",
            {"workload": TWO_RANKS,
             "fault": {"kind": "stale_pointer", "rank": 0, "step": 8, "file": "@pointer", "points_to": "older"},
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED, LOUD})),
    Catcher("power_loss", "power cut at any instant of the step-8 save (crash states explored and "
            "restored by real ranks)",
            {"workload": TWO_RANKS, "fault": {"kind": "power_loss", "step": 8},
             "timeouts": {"phase": 60}},
            frozenset({RECOVERED, LOUD})),
    Catcher("writer_thread_exception", "an exception raised in the thread writing rank 1's first file of the "
            "step-12 save (a DCP-shaped async save's background writer), the job's last save: the job must fail "
            "loudly (the step-8 restore is then right)",
            {"workload": TWO_RANKS,
             "fault": {"kind": "crash", "how": "thread_exception", "rank": 1, "step": 12, "point": "write",
                       "file": "*", "after_bytes": 4096},  # its first file, whatever its name
             "timeouts": {"collective": 20, "phase": 60}},
            frozenset({LOUD}), fallback_ok=True),
    Catcher("shard_missing_at_marker", "rank 1 aborts (SIGABRT) as the step-8 save starts, before its shard: "
            "a restore may refuse step 8, but not while step 4 is intact (fallback required)",
            {"workload": TWO_RANKS, "fault": {"kind": "crash", "how": "abort", "rank": 1, "step": 8},
             "timeouts": {"collective": 20, "phase": 60}},
            frozenset({RECOVERED, LOUD}), fallback_required=True),
    Catcher("unresponsive_peer", "rank 1 holds its GIL in a C call (libc sleep through ctypes.PyDLL) as the "
            "step-8 save starts: its peers must time out (5 s collective timeout), not wait forever",
            {"workload": {**TWO_RANKS, "steps": 8}, "fault": {"kind": "gil_hang", "rank": 1, "step": 8},
             "timeouts": {"collective": 5, "phase": 25}},  # short: the hang planted here costs one deadline
            frozenset({RECOVERED, LOUD})),
    Catcher("failed_all_reduce", "rank 1's TCP connections (gloo's pairs) shut down as step 6 trains, per-rank "
            "RNG streams: both ranks fail in the gradient all-reduce; the restart must resume from a state "
            "some step ended in (step 4)",
            {"workload": {**TWO_RANKS, "steps": 8, "rank_rng": "distinct"},
             "fault": {"kind": "collective_failure", "how": "transport", "rank": 1, "step": 6, "phase": "train"},
             "timeouts": {"collective": 10, "phase": 60}},
            frozenset({RECOVERED, LOUD})),
    Catcher("saves_in_flight", "DCP-shaped async saves every step; rank 1's writes stall from the step-3 save "
            "on and it is killed with two saves in flight: a refusal beside a committed step fails",
            {"workload": {**TWO_RANKS, "steps": 6, "checkpoint_every": 1},
             "fault": {"kind": "overlapping_async", "rank": 1, "step": 3, "file": "step_0000000[3-6]/*"},
             "timeouts": {"collective": 10, "phase": 60}},
            frozenset({RECOVERED, LOUD}), fallback_ok=True, fallback_required=True),
)

PER_RANK, RANK_ZERO = "torch.per_rank", "torch.rank0"

BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("optimizer_not_restored", "optimizer state not restored (a model-only load)",
               STATE_BUG + "ForgetsOptimizer", "kill_in_training", PER_RANK),
    PlantedBug("rank0_stream_everywhere", "RNG not restored per rank: every rank gets rank 0's stream",
               STATE_BUG + "RankZeroFileEverywhere", "kill_in_training", PER_RANK),
    PlantedBug("data_position_not_restored", "data loader position not restored: the epoch starts again",
               STATE_BUG + "ForgetsDataPosition", "kill_in_training", PER_RANK),
    PlantedBug("async_snapshot_after_return", "an async save that snapshots after returning: tensors "
               "mutated by the next steps", STATE_BUG + "SnapshotsAfterReturning", "kill_in_training", PER_RANK),
    PlantedBug("missing_keys_ignored", "missing keys silently ignored (strict=False, DDP's module. "
               "prefix)", STATE_BUG + "IgnoresMissingKeys", "kill_in_training", PER_RANK),
    PlantedBug("loads_oldest", "the oldest checkpoint restored (a sort in the wrong direction)",
               STATE_BUG + "LoadsOldest", "kill_in_training", PER_RANK),
    PlantedBug("tiers_mixed", "one rank restored from storage while the others restored the same step from "
               "memory (two tiers, each rank's state valid)", TIER_BUG + "LastRankFromStorage", "kill_in_training",
               TIER_BUG + "TwoTierSave"),
    PlantedBug("save_consumes_randomness", "a save that draws from the training RNG",
               STATE_BUG + "SaveConsumesRandomness", "kill_in_training", PER_RANK),
    PlantedBug("state_beside_checkpoint", "part of the state kept in the first run's working directory, read back "
               "by absolute path", STATE_BUG + "KeepsScheduleBesideCheckpoint", "kill_in_training", PER_RANK),
    PlantedBug("ema_saved_as_weights", "the live weights saved where the EMA belongs",
               WORKLOAD_BUG + "EmaSavedAsWeights", "full_state_kill", PER_RANK),
    PlantedBug("sampler_epoch_not_restored", "set_epoch not called on resume: the epoch replays epoch 0's shuffle",
               WORKLOAD_BUG + "ReshufflesFromEpochZero", "full_state_kill", PER_RANK),
    PlantedBug("prefetched_counted_as_trained", "the loader position counted from what the workers prefetched",
               WORKLOAD_BUG + "CountsPrefetchedBatches", "full_state_kill", PER_RANK),
    PlantedBug("accumulation_not_counted", "a mid-epoch resume that skips one batch per step, not per micro-batch",
               WORKLOAD_BUG + "SkipsStepsNotMicroBatches", "full_state_kill", PER_RANK),
    PlantedBug("scaler_not_saved", "the fp16 loss scaler neither saved nor restored (a fresh one on resume)",
               WORKLOAD_BUG + "ScalerNotSaved", "full_state_kill", PER_RANK),
    PlantedBug("stale_buffer_saved", "the model's state dict taken once and saved again: a buffer updated out of "
               "place is written stale", WORKLOAD_BUG + "CachesModelStateDict", "full_state_kill", PER_RANK),
    PlantedBug("tied_weights_untied", "tied weights loaded into two parameters (assign=True): one stops training",
               WORKLOAD_BUG + "UntiesAtLoad", "full_state_kill", PER_RANK),
    PlantedBug("held_tensors_saved_after_load", "a load that replaces the tensors a save still references "
               "(assign=True): every save after a resume writes the weights from before it",
               TIMELINE_BUG + "SavesTensorsHeldBeforeLoad", "second_resume", PER_RANK),
    PlantedBug("data_position_reset_on_second_resume", "the loader reports the state it was restored with until "
               "re-iterated: restored on the first resume, the same position again on the second",
               TIMELINE_BUG + "KeepsLoadedDataPosition", "second_resume", PER_RANK),
    PlantedBug("loaded_state_cached_for_saves", "the restored state dict kept as the save cache, its tensors "
               "never refreshed: saves after a resume write the restored step's weights",
               TIMELINE_BUG + "CachesLoadedState", "second_resume", PER_RANK),
    PlantedBug("last_save_left_in_flight", "a save that returns once staged and writes when the next step "
               "begins: the job's last save is never written, and the job ends believing it saved",
               TIMELINE_BUG + "DefersWriteToNextStep", "clean_exit",
               {"name": TIMELINE_BUG + "DefersWriteToNextStep", "options": {"flush_at_exit": True}}),
    PlantedBug("shard_saved_under_another_name", "rank 1 writes its shard under a name no restore reads: every "
               "save returns, none can be restored", TIMELINE_BUG + "MisnamesRankOneShard", "clean_exit", PER_RANK),
    PlantedBug("loads_by_local_rank", "shards loaded by local rank instead of global rank",
               STATE_BUG + "LoadsByLocalRank", "two_nodes", PER_RANK),
    PlantedBug("reshard_zero_fill", "resharding that zero-fills part of a tensor",
               STATE_BUG + "ZeroFillReshard", "fewer_ranks", RANK_ZERO),
    PlantedBug("torn_write_accepted", "a torn write accepted (the load error swallowed, the job "
               "starts over claiming success)", STORAGE_BUG + "IgnoresTornSave", "torn_write", PER_RANK),
    PlantedBug("stale_lock_wait", "a restore that waits forever for a lock the killed writer left",
               STORAGE_BUG + "WaitsOnStaleLock", "torn_write", PER_RANK),
    PlantedBug("enospc_swallowed", "a save that swallows ENOSPC and reports the step saved",
               STORAGE_BUG + "SwallowsEnospc", "disk_full", TWIN + "AtomicFallbackSave"),
    PlantedBug("version_stamp_ignored", "a version stamp ignored (only older formats refused)",
               STORAGE_BUG + "IgnoresNewerVersion", "newer_version",
               {"name": PER_RANK, "options": {"check_version": True}}),
    PlantedBug("foreign_shard_accepted", "a shard written by another rank accepted",
               STORAGE_BUG + "AcceptsForeignShard", "foreign_shard", TWIN + "RankStampedPerRank"),
    PlantedBug("pickle_loaded_in_full", "a checkpoint loaded with full unpickling (weights_only=False)",
               STORAGE_BUG + "UnpicklesInFull", "hostile_pickle", PER_RANK),
    PlantedBug("stale_pointer_followed", "a stale `latest` pointer followed past a complete checkpoint",
               STORAGE_BUG + "FollowsStalePointer", "stale_pointer", TWIN + "DurableShardsThenPointer"),
    PlantedBug("pointer_before_durable_shards", "the pointer made durable before the shards it names",
               STORAGE_BUG + "PointerBeforeDurableShards", "power_loss", TWIN + "DurableShardsThenPointer"),
    PlantedBug("writer_error_swallowed", "a background writer's exception logged, not raised: the job "
               "believes the step saved", ASYNC_BUG + "SwallowsWriterError", "writer_thread_exception",
               {"name": "dcp", "options": {"mode": "async"}}),
    PlantedBug("marker_names_missing_shard", "a completion marker published before every shard is written, "
               "followed at restore into a loud refusal beside an intact older step",
               ASYNC_BUG + "PointerBeforeEveryShard", "shard_missing_at_marker", TWIN + "DurableShardsThenPointer"),
    PlantedBug("peer_wait_without_deadline", "a save that polls for its peers' files with no deadline",
               STORAGE_BUG + "PollsForPeersForever", "unresponsive_peer", PER_RANK),
    PlantedBug("mid_step_emergency_save", "an emergency checkpoint saved from a failed step's exception handler: "
               "the step's batch and noise already drawn", STATE_BUG + "SavesMidStepOnFailure", "failed_all_reduce",
               PER_RANK),
    PlantedBug("pointer_to_uncommitted_save", "a `latest` pointer moved when an async save returns, before its "
               "write is committed", ASYNC_BUG + "PointsAtUncommittedSave", "saves_in_flight",
               {"name": "dcp", "options": {"mode": "async", "overlap": True}}),
)


def catcher(name: str) -> Catcher:
    return next(c for c in CATCHERS if c.name == name)
