"""Crash-state exploration: the IO trace, the post-crash disk model, and the explorer on real ranks.

The model tests write small traces by hand (what a rank would record) and check the disk states
the model allows. The recording test runs a real save in a forked child with the power_loss
fault armed, as a rank does, and checks the trace rebuilds the directory byte for byte. The
explorer tests run real gloo ranks: a strategy that makes its pointer durable before its shards
is caught as SILENT and shrunk to one crash state; a careful one recovers from every state drawn.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from resilience.core.case import FaultSpec, Trigger, VerdictKind
from resilience.disk.crash_states import CrashModel, CrashPoint, Loss
from resilience.disk.enumeration import Bounds, count_points, distinct_states, points
from resilience.disk.interception import Interceptor
from resilience.disk.io_trace import TraceWriter, read_trace
from resilience.disk.state_tree import materialise, read_tree, state_hash
from resilience.errors import ScenarioError
from resilience.faults.base import Clock, RankEnvironment
from resilience.faults.write_path.power_loss import PowerLoss, trace_dir
from resilience.run.explore_reduction import enumerate_within
from resilience.run.harness import Harness
from tests.harness_helpers import case_from
from tests.procs import child_pids

FORK = multiprocessing.get_context("fork")
SAVE = 8  # the explored save; step 4 is the earlier, durable one


class Recorder:
    """Writes a rank's trace as the power_loss fault would, one op per call."""

    def __init__(self, directory: Path, rank: int = 0):
        self.writer = TraceWriter(directory, rank)

    def __call__(self, step: int, kind: str, payload: bytes | None = None, **fields):
        self.writer.record(step, kind, payload, **fields)

    def close(self):
        self.writer.close()


def write_file(record: Recorder, step: int, path: str, data: bytes, fsync: bool = False, truncate: bool = True):
    record(step, "open", path=path, truncate=truncate)
    record(step, "write", data, path=path, offset=0)
    if fsync:
        record(step, "fsync", path=path)
    record(step, "close", path=path)


def model_of(tmp_path: Path, world_size: int = 1) -> CrashModel:
    return CrashModel(tmp_path, world_size, SAVE)


def disk(model: CrashModel, **point) -> dict[str, bytes]:
    point.setdefault("cuts", model.op_counts)
    return model.disk(CrashPoint(**point))[0]


# -- the model --------------------------------------------------------------------------------------

def test_a_rename_without_a_directory_fsync_may_not_persist(tmp_path):
    record = Recorder(tmp_path)
    write_file(record, SAVE, "ckpt.tmp", b"new state", fsync=True)
    record(SAVE, "rename", path="ckpt.tmp", target="ckpt")
    record.close()
    model = model_of(tmp_path)
    assert [op.kind for op in model.volatile(model.op_counts).metadata] == ["open", "rename"]
    assert disk(model) == {"ckpt": b"new state"}
    assert disk(model, lost_metadata=1) == {"ckpt.tmp": b"new state"}  # the rename never reached the disk
    assert disk(model, lost_metadata=2) == {}  # nor the file's creation


def test_a_directory_fsync_commits_every_namespace_op_before_it(tmp_path):
    record = Recorder(tmp_path)
    record(SAVE, "mkdir", path="step")
    write_file(record, SAVE, "step/ckpt.tmp", b"new state", fsync=True)
    record(SAVE, "rename", path="step/ckpt.tmp", target="step/ckpt")
    record(SAVE, "dir_fsync", path="step")
    record.close()
    model = model_of(tmp_path)
    assert model.volatile(model.op_counts).metadata == ()
    files, dirs = model.disk(CrashPoint(cuts=model.op_counts))
    assert files == {"step/ckpt": b"new state"} and dirs == {".", "step"}


def test_unsynced_data_is_kept_dropped_torn_or_holed_and_fsynced_data_is_not(tmp_path):
    record = Recorder(tmp_path)
    record(SAVE - 4, "mkdir", path="d")  # the earlier save: durable
    write_file(record, SAVE, "d/synced", b"s" * 5000, fsync=True)
    data = bytes(range(256)) * 40  # 10240 bytes: three 4 KiB blocks
    write_file(record, SAVE, "d/unsynced", data)
    record(SAVE, "dir_fsync", path="d")
    record.close()
    model = model_of(tmp_path)
    assert model.volatile(model.op_counts).dirty == (("d/unsynced", len(data), len(data)),)
    for how, expected in (("keep", data), ("drop", b""), ("prefix", data[:1000])):
        files = disk(model, losses=(Loss("d/unsynced", how, keep_bytes=1000),))
        assert files == {"d/synced": b"s" * 5000, "d/unsynced": expected}, how
    holed = disk(model, losses=(Loss("d/unsynced", "zeros", zero_from=4096, zero_to=8192),))["d/unsynced"]
    assert holed == data[:4096] + bytes(4096) + data[8192:]  # the size reached the disk, one block did not


def test_a_truncating_rewrite_of_a_durable_file_can_leave_it_empty_or_old(tmp_path):
    """DeepSpeed's `latest`: open(..., "w") and write, no fsync, over the earlier save's file."""
    record = Recorder(tmp_path)
    write_file(record, SAVE - 4, "latest", b"global_step4")
    write_file(record, SAVE, "latest", b"global_step8")
    record.close()
    model = model_of(tmp_path)
    assert disk(model, cuts=(0,)) == {"latest": b"global_step4"}
    assert disk(model) == {"latest": b"global_step8"}
    assert disk(model, losses=(Loss("latest", "drop"),)) == {"latest": b"global_step4"}
    assert disk(model, losses=(Loss("latest", "prefix", keep_bytes=0),)) == {"latest": b""}  # the 0-byte file
    assert disk(model, losses=(Loss("latest", "prefix", keep_bytes=7),)) == {"latest": b"global_"}


def test_a_node_agents_persist_follows_the_ranks_and_only_its_return_makes_a_save_survive(tmp_path):
    """DLRover's shape: the ranks' saves go to memory (no file op), node 0's agent persists every
    fourth step in the background (stream ``world_size + 0``): a memory-only save never survives
    the cut, and the explored save counts as returned only once the agent's persist returned."""
    ranks, agent = [Recorder(tmp_path, 0), Recorder(tmp_path, 1)], Recorder(tmp_path, 2)
    for step in (SAVE - 4, SAVE - 2, SAVE):
        for rank in ranks:
            rank(step, "returned")
    write_file(agent, SAVE - 4, "4/rank_0.pt", b"four")
    agent(SAVE - 4, "returned")
    write_file(agent, SAVE, "8/rank_0.pt", b"eight")
    write_file(agent, SAVE, "tracker", b"8", fsync=True)
    agent(SAVE, "returned")
    for recorder in (*ranks, agent):
        recorder.close()
    model = model_of(tmp_path, world_size=2)
    assert model.op_counts == (1, 1, 8)
    assert [op.kind for op in model.merged[:2]] == ["returned", "returned"]  # the ranks' ops first
    assert model.survives(SAVE - 4) and not model.survives(SAVE - 2)  # step 6 was memory only
    assert model.returned(CrashPoint(cuts=(1, 1, 7))) == frozenset()  # the agent had not returned
    assert model.returned(CrashPoint(cuts=(1, 1, 8))) == {0, 1}
    assert disk(model, cuts=(1, 1, 0)) == {"4/rank_0.pt": b"four"}
    # the tracker fsynced, the shard not: the tracker names a step whose shard never reached the disk
    assert disk(model, losses=(Loss("8/rank_0.pt", "drop"),))["tracker"] == b"8"
    assert "node 0's agent lost power" in "\n".join(model.describe(CrashPoint(cuts=(1, 1, 4))))


def test_the_power_cut_is_one_instant_for_every_rank(tmp_path):
    ranks = [Recorder(tmp_path, 0), Recorder(tmp_path, 1)]
    ranks[0](SAVE, "open", path="a", truncate=True)
    ranks[1](SAVE, "open", path="b", truncate=True)
    for chunk in range(3):  # interleaved runs of writes: cuts inside them are prefix losses
        ranks[0](SAVE, "write", b"x" * 10, path="a", offset=10 * chunk)
        ranks[1](SAVE, "write", b"y" * 10, path="b", offset=10 * chunk)
    ranks[1](SAVE, "close", path="b")
    ranks[1](SAVE, "returned")
    ranks[0](SAVE, "close", path="a")
    for recorder in ranks:
        recorder.close()
    model = model_of(tmp_path, world_size=2)
    assert model.op_counts == (5, 6)
    boundaries = model.boundaries()
    # the ranks in lockstep, whatever the trace's clock said: the same instants in every run
    assert [model.cuts_at(b) for b in boundaries] == [(0, 0), (1, 0), (1, 1), (4, 3), (4, 4), (5, 4), (5, 5), (5, 6)]
    assert model.cuts_at(len(model.merged)) == model.op_counts
    assert model.order_note == ""


def test_no_op_after_a_collective_is_ordered_before_an_op_before_it(tmp_path):
    """Rank 0 writes its shard, then every rank passes a barrier, then rank 0 writes the pointer: no
    instant has the pointer without rank 1's shard, though rank 1's shard takes longer to write."""
    ranks = [Recorder(tmp_path, 0), Recorder(tmp_path, 1)]
    write_file(ranks[0], SAVE, "shard0", b"a")
    ranks[1](SAVE, "open", path="shard1", truncate=True)
    ranks[1](SAVE, "write", b"b", path="shard1", offset=0)
    ranks[1](SAVE, "write", b"c", path="shard1", offset=1)
    ranks[1](SAVE, "close", path="shard1")
    for recorder in ranks:
        recorder(SAVE, "sync", target="barrier")
    write_file(ranks[0], SAVE, "latest", b"8")
    for recorder in ranks:
        recorder(SAVE, "returned")
        recorder.close()
    model = model_of(tmp_path, world_size=2)
    for count in model.boundaries():
        cuts = model.cuts_at(count)
        if cuts[0] > 3:  # rank 0 is past the barrier
            assert cuts[1] >= 4, cuts  # so rank 1 finished its shard
    assert all(op.kind != "sync" for ops in model.ops for op in ops)


def test_ranks_that_disagree_on_their_collectives_keep_the_clocks_order_and_say_so(tmp_path):
    ranks = [Recorder(tmp_path, 0), Recorder(tmp_path, 1)]
    ranks[0](SAVE, "sync", target="barrier")
    for recorder in ranks:
        write_file(recorder, SAVE, f"shard{recorder.writer.rank}", b"x")
        recorder.close()
    model = model_of(tmp_path, world_size=2)
    assert "different numbers of collectives (rank 0: 1, rank 1: 0)" in model.order_note
    assert model.op_counts == (3, 3)


def test_the_collective_hooks_report_blocking_whole_world_collectives_once(tmp_path):
    code = f'''
import torch, torch.distributed as dist
from resilience.disk.collective_hooks import CollectiveHooks
seen = []
hooks = CollectiveHooks(seen.append)
hooks.install()
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
dist.barrier()
dist.all_gather_object([None], 1)  # tensor collectives inside: reported once
dist.all_reduce(torch.ones(1), async_op=True).wait()  # returns before it completes: not a bound
dist.broadcast_object_list([1], src=0)
hooks.uninstall()
dist.barrier()
dist.destroy_process_group()
print(seen)
'''
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['barrier', 'all_gather_object', 'broadcast_object_list']"


def test_identical_disk_states_share_a_hash_and_materialise_as_real_directories(tmp_path):
    files = {"step/a.pt": b"\x00\x01", "latest": b"step"}
    materialise(files, {".", "step", "empty"}, tmp_path / "state")
    assert read_tree(tmp_path / "state") == (files, {".", "step", "empty"})
    assert state_hash(files, {".", "step"}) == state_hash(dict(reversed(files.items())), {"step", "."})
    assert state_hash(files, {".", "step"}) != state_hash({**files, "latest": b"stop"}, {".", "step"})


def test_the_bounded_model_enumerates_every_fate_of_each_unsynced_file_and_keeps_distinct_states(tmp_path):
    record = Recorder(tmp_path)
    record(SAVE - 4, "mkdir", path="d")  # durable
    record(SAVE - 4, "dir_fsync", path="d")
    data = bytes(range(256)) * 48  # 12288 bytes: three blocks, never fsynced
    write_file(record, SAVE, "d/ckpt", data)
    record(SAVE, "returned")
    record.close()
    model = model_of(tmp_path)
    listed = list(points(model, Bounds()))
    assert len(listed) == count_points(model, Bounds())
    enumeration = distinct_states(model, limit=100)
    assert enumeration.complete and len({state.digest for state in enumeration.states}) == len(enumeration.states)
    contents = {model.disk(state.points[0])[0].get("d/ckpt") for state in enumeration.states}
    holes = [data[:block] + bytes(4096) + data[block + 4096:] for block in (0, 4096, 8192)]
    # not yet created, empty (dropped or torn at 0 bytes), half, whole, and a hole in each chosen block
    assert contents == {None, b"", data[:len(data) // 2], data, *holes}
    # the whole file on disk is judged apart before and after the save returned
    whole = next(state for state in enumeration.states if model.disk(state.points[0])[0].get("d/ckpt") == data)
    assert {model.returned(point) for point in whole.points} == {frozenset(), frozenset({0})}
    too_many = distinct_states(model, limit=3)
    assert not too_many.complete and too_many.states == () and "more than 3 distinct" in too_many.too_large


# -- recording in a rank process ----------------------------------------------------------------------

def _traced_save(root: Path, case_dir: Path) -> None:
    """In a forked child: what a rank does with the power_loss fault armed, then a save."""
    fault = PowerLoss(FaultSpec(kind="power_loss", trigger=Trigger(rank=0, step=SAVE, phase="save", point="any",
                                                                    file="*", after_bytes=None),
                                params={"profile": "ci"}))
    clock = Clock()
    Interceptor(root, [fault]).install()
    fault.arm(RankEnvironment(rank=0, world_size=1, checkpoint_dir=root, clock=clock,
                              emit=lambda *a, **k: None, case_dir=case_dir))
    clock.phase, clock.save_step, clock.step = "save", SAVE, SAVE
    (root / "step_8").mkdir()
    torch.save({"w": torch.arange(5000, dtype=torch.float32)}, root / "step_8" / "model.pt")
    with open(root / "latest.tmp", "w") as f:
        f.write("step_8")
        f.flush()
        os.fsync(f.fileno())
    os.replace(root / "latest.tmp", root / "latest")
    descriptor = os.open(root, os.O_RDONLY)
    os.fsync(descriptor)
    os.close(descriptor)
    os.unlink(root / "stale")
    fault.after_save(None, SAVE)  # records that the save returned, then ends the process: os._exit(0)
    os._exit(3)


def test_the_trace_of_a_real_save_rebuilds_the_directory_byte_for_byte(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "stale").write_bytes(b"removed by the save")
    child = FORK.Process(target=_traced_save, args=(root, tmp_path))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    ops, _ = read_trace(trace_dir(tmp_path), 0)
    kinds = [op.kind for op in ops]
    assert kinds[:2] == ["mkdir", "open"] and kinds[-6:] == ["fsync", "close", "rename", "dir_fsync", "unlink",
                                                             "returned"]
    assert {op.path for op in ops if op.kind == "write"} == {"step_8/model.pt", "latest.tmp"}
    assert ops[-4].path == "latest.tmp" and ops[-4].target == "latest" and ops[-3].path == "."
    model = CrashModel(trace_dir(tmp_path), 1, SAVE)
    rebuilt_files, rebuilt_dirs = model.disk(model.complete())
    assert (rebuilt_files, rebuilt_dirs) == read_tree(root)
    assert torch.load(root / "step_8" / "model.pt", weights_only=True)["w"].shape == (5000,)


# -- the scenario surface -----------------------------------------------------------------------------

def test_a_power_loss_names_no_rank():
    case = case_from(fault={"kind": "power_loss", "step": SAVE})
    assert case.fault.trigger.step == SAVE and case.fault.params == {"profile": "ci"}
    with pytest.raises(ScenarioError, match=r"fault\.rank: .*every rank.*got 1"):
        case_from(fault={"kind": "power_loss", "step": SAVE, "rank": 1})
    with pytest.raises(ScenarioError, match=r"fault\.profile.*allowed: ci, long"):
        case_from(fault={"kind": "power_loss", "step": SAVE, "profile": "forever"})


# -- the explorer on real ranks -----------------------------------------------------------------------

def explore(tmp_path, strategy: str, expect: str, restores: int):
    case = case_from(strategy=f"tests.strategies_under_test:{strategy}", expect=expect,
                     workload={"steps": 12}, fault={"kind": "power_loss", "step": SAVE},
                     timeouts={"phase": 60})
    result = Harness(work_root=tmp_path, keep=True, explore_restores=restores).run(case)
    return result, json.loads((result.work_dir / "exploration.json").read_text())


def test_a_pointer_made_durable_before_its_shards_is_caught_and_shrunk_to_one_crash_state(tmp_path):
    result, report = explore(tmp_path, "PointerBeforeDurableShards", "fails_loudly", restores=60)
    verdict = result.verdict
    assert verdict.kind is VerdictKind.SILENT, verdict.findings
    assert report["failing"] and report["counts"]["SILENT"] >= 1
    point = report["reported"]["point"]
    # one shard lost blocks the disk never got; every other file reached the disk whole
    assert len(point["losses"]) == 1 and point["losses"][0]["how"] == "zeros"
    assert point["losses"][0]["path"].startswith("step_00000008/shard_")
    assert point["losses"][0]["zero_to"] - point["losses"][0]["zero_from"] == 4096
    assert point["lost_metadata"] == 0
    assert verdict.restored_step == SAVE and verdict.complete_step == 4
    text = "\n".join(verdict.findings)
    assert "the smallest Hypothesis shrank to" in text
    assert "rename latest.tmp -> latest" in text  # where rank 0 was: its pointer already renamed
    assert "read as zeros" in text and "differs from the reference" in text


def test_a_careful_strategy_recovers_from_every_crash_state_drawn(tmp_path):
    result, report = explore(tmp_path, "DurableShardsThenPointer", "recovers", restores=20)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert set(report["counts"]) == {"RECOVERED"} and sum(report["counts"].values()) >= 5
    assert {state["point"]["cuts"][0] for state in report["states"]} != {0}  # it did cut inside the save


def test_a_refused_crash_state_beside_an_intact_older_step_says_so(tmp_path):
    result, _ = explore(tmp_path, "DurableWithoutFallback", "fails_loudly", restores=16)
    verdict = result.verdict
    assert verdict.kind is VerdictKind.LOUD and verdict.intact_step == 4, verdict.findings
    assert any(finding.startswith("refused; step 4 was intact and never tried") for finding in verdict.findings)


def test_a_rename_without_a_directory_fsync_loses_a_checkpoint_whose_save_returned(tmp_path):
    result, report = explore(tmp_path, "AtomicFallbackSave", "fails_loudly", restores=30)
    assert result.verdict.kind is VerdictKind.SILENT, result.verdict.findings
    assert any("lost checkpoint" in finding for finding in result.verdict.findings)
    assert result.verdict.restored_step == 4 and result.verdict.complete_step == SAVE
    assert report["reported"]["point"]["lost_metadata"] >= 1  # a rename never reached the directory
    assert any("rename step_00000008/ckpt_rank_" in finding for finding in result.verdict.findings)


def _ranks_of_the_fork_server() -> list[int]:
    """Processes forked by this test process's fork server (ranks, warm or not) still alive."""
    servers = [pid for pid in child_pids(os.getpid())
               if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    return [rank for server in servers for rank in child_pids(server)]


def test_the_seed_scheme_is_explored_exhaustively_in_warm_ranks_and_the_canary_agrees(tmp_path):
    case = case_from(strategy="torch.rank0", expect="fails_loudly", workload={"steps": 12},
                     fault={"kind": "power_loss", "step": SAVE}, timeouts={"phase": 60})
    result = Harness(work_root=tmp_path, keep=True).run(case)
    report = json.loads((result.work_dir / "exploration.json").read_text())
    assert result.verdict.kind is VerdictKind.SILENT and result.verdict.restored_step == SAVE, result.verdict.findings
    assert report["enumerated"] == report["restores"] and report["restored_in"].startswith("warm ranks")
    assert f"explored {report['restores']} of {report['restores']} distinct crash states" in result.verdict.findings[0]
    assert report["canaries"] >= 1 and not report["canary_note"]
    assert not result.sampled
    assert _ranks_of_the_fork_server() == []  # the warm groups, active and standby, are gone


def test_a_strategy_that_caches_its_first_load_in_a_module_global_is_caught_by_the_canary(tmp_path):
    result, report = explore(tmp_path, "CachesFirstLoad", "fails_loudly", restores=60)
    assert "warm ranks and fresh ranks disagreed" in report["canary_note"], report
    assert report["restored_in"].startswith("fresh ranks")  # every state restored again, afresh
    # what fresh ranks make of the scheme it wraps: a zeroed block inside a tensor, restored at step 8
    assert result.verdict.kind is VerdictKind.SILENT and result.verdict.restored_step == SAVE, result.verdict.findings
    assert any("disagreed" in finding for finding in result.verdict.findings)
    assert _ranks_of_the_fork_server() == []


def test_the_explore_command_runs_only_power_loss_cases(tmp_path, capsys):
    from resilience.commands.cli import main

    scenario = tmp_path / "mixed.scenario.yaml"
    scenario.write_text("name: no power loss here\ndescription: a kill case\nstrategy: torch.rank0\n"
                        "workload: {model: mlp, world_size: 2, steps: 8, checkpoint_every: 4}\n"
                        "fault: {kind: kill, rank: 0, step: 4, phase: save}\nexpect: recovers\n")
    assert main(["explore", str(scenario), "--workdir", str(tmp_path / "work")]) == 0
    assert capsys.readouterr().out == ""  # the kill case was not run


def test_a_warm_rank_whose_group_never_formed_is_not_reused(tmp_path):
    """torch counts unnamed groups per process and resets the counter only when a formed group is
    destroyed: after one rendezvous that timed out, every later group of that rank waits for keys
    under another name than its peers'. The warm rank reports it as something left behind."""
    code = f'''
import datetime, torch.distributed as dist
from resilience.rank.warm_rank import leftovers, process_state
clean = process_state()
store = dist.FileStore("{tmp_path}/store", 2)
try:
    dist.init_process_group("gloo", store=dist.PrefixStore("restore0/", store), rank=0, world_size=2,
                            timeout=datetime.timedelta(seconds=1))
except RuntimeError:  # the peer never came: "Wait timeout"
    pass
print(leftovers(clean, process_state()))
'''
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "process group counter at 1, not 0 (a group that never formed)" in out.stdout


def test_a_mkdir_that_lost_the_race_for_the_directory_is_traced_too(tmp_path):
    """Every rank creates the save's directory; which one wins is timing. Each rank's trace holds
    its mkdir either way, so its ops (and the crash states) are the same in every run."""
    from resilience.disk.io_trace import NamespaceHooks

    seen = []
    hooks = NamespaceHooks(tmp_path, lambda kind, **fields: seen.append((kind, fields["path"])))
    hooks.install()
    try:
        os.makedirs(tmp_path / "step_00000008", exist_ok=True)
        os.makedirs(tmp_path / "step_00000008", exist_ok=True)  # the other rank's, after the winner's
        with pytest.raises(FileExistsError):
            os.mkdir(tmp_path / "step_00000008")
    finally:
        hooks.uninstall()
    assert seen == [("mkdir", "step_00000008")] * 3


def _explored_with_and_without_reduction(case, tmp_path: Path) -> tuple[dict, dict]:
    """The exploration reports of ``case`` with the reduction and restoring every state for real,
    each having explored every distinct state."""
    reports = {}
    for reduce in (True, False):
        result = Harness(work_root=tmp_path / str(reduce), keep=True, explore_restores=400,
                         explore_reduce=reduce).run(case)
        reports[reduce] = json.loads((result.work_dir / "exploration.json").read_text())
    reduced, full = reports[True], reports[False]
    assert reduced["enumerated"] == full["enumerated"] == full["restores"], (reduced["too_large"], full["too_large"])
    return reduced, full


def test_the_reduction_never_merges_two_states_a_planted_bug_tells_apart(tmp_path):
    """Every distinct crash state of a planted bug's save (its pointer durable before its shards:
    SILENT, LOUD and RECOVERED states), judged once with the reduction (states that answer every
    look of a restore alike share its restart) and once restoring each for real: the same verdict,
    state by state."""
    case = case_from(strategy="tests.strategies_under_test:PointerBeforeDurableShards", expect="fails_loudly",
                     workload={"steps": 12}, fault={"kind": "power_loss", "step": SAVE}, timeouts={"phase": 60})
    reduced, full = _explored_with_and_without_reduction(case, tmp_path)
    assert reduced["stood_in"] > 0 and full["stood_in"] == 0
    by_state = {(s["digest"], json.dumps(s["point"]["cuts"])): s["verdict"] for s in full["states"]}
    merged = {(s["digest"], json.dumps(s["point"]["cuts"])): s["verdict"] for s in reduced["states"]}
    assert merged == by_state
    assert len(set(by_state.values())) == 3  # the verdicts it tells apart
    assert not reduced["canary_note"]


def test_a_manifest_compares_so_damaged_files_share_a_restore_yet_no_two_states_it_tells_apart_do(tmp_path):
    """The checksum manifest over `torch.per_rank`: its restore only compares each file with the
    manifest's size and SHA-256 (`core.file_comparison`), so states that damage a file in other ways
    share one restore. Judged with the reduction and restoring every state for real: the same
    verdict and restored step, state by state, and states that restore step 8 beside states that
    fall back to step 4."""
    case = case_from(strategy={"name": "manifest", "options": {"inner": "torch.per_rank"}}, expect="recovers",
                     workload={"steps": 12}, fault={"kind": "power_loss", "step": SAVE}, timeouts={"phase": 60})
    reduced, full = _explored_with_and_without_reduction(case, tmp_path)
    assert reduced["stood_in"] > full["stood_in"] == 0
    # by crash point, not digest: the manifest's temporary file is named after the writing pid
    outcome, merged = ({re.sub(r"\.\d+\.tmp", ".tmp", json.dumps(s["point"], sort_keys=True)):
                        (s["verdict"], s["restored_step"]) for s in report["states"]} for report in (full, reduced))
    assert merged == outcome
    assert {step for _, step in outcome.values()} >= {4, 8}
    assert not reduced["canary_note"]


def test_a_restore_reports_each_look_under_its_checkpoint_directory_and_how(tmp_path):
    """In a process of its own (an audit hook stays for the process's life): each kind of look,
    and nothing outside the directory."""
    script = f"""
import json, os, shutil, sys
from resilience.rank.working_dir import observe_paths
root = {str(tmp_path / "ckpt")!r}
os.makedirs(root + "/step_4/inner"); open(root + "/step_4/a.pt", "wb").write(b"x" * 10)
looks = []
observe_paths(root, lambda kind, **fields: looks.append((fields["path"], fields["how"])))
os.path.exists(root + "/latest")
open(root + "/step_4/a.pt", "rb").read()
open(root + "/step_8.tmp", "wb").close()
os.listdir(root)
list(os.scandir(root + "/step_4"))
with os.scandir(root) as entries:
    [entry.stat().st_size for entry in entries if entry.name == "step_8.tmp"]
os.stat(root + "/step_4/a.pt").st_size
os.stat(root + "/step_4").st_mode
os.rename(root + "/step_8.tmp", root + "/step_8")
shutil.rmtree(root + "/step_4/inner")
os.path.exists({str(tmp_path)!r})
from resilience.core.file_comparison import comparing
with comparing(root + "/step_4/c.pt", 3, "ab"):
    os.stat(root + "/step_4/a.pt").st_size
open(root + "/step_4/c.pt", "wb").write(b"abc")
with comparing(root + "/step_4/c.pt", 3, "ab"):
    os.stat(root + "/step_4/c.pt").st_size, open(root + "/step_4/c.pt", "rb").read()
observe_paths(None, None)
os.path.exists(root + "/after")
print(json.dumps(sorted(set(looks))), os.stat is observe_paths.__globals__["_UNAUDITED"]["stat"])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    looks, restored = done.stdout.rsplit(" ", 1)
    seen = {tuple(look) for look in json.loads(looks)}
    assert seen >= {("latest", "kind"), ("step_4/a.pt", "read"), ("step_8.tmp", "dir"), ("step_8.tmp", "replaced"),
                    (".", "list"),
                    ("step_4", "scan"), ("step_4/a.pt", "stat"), ("step_4", "kind"), ("step_8.tmp", "change"),
                    ("step_8", "change"), ("step_4/inner", "tree")}, seen
    assert ("step_4", "stat") not in seen  # st_mode only: its kind
    assert ("step_8.tmp", "stat") in seen and ("step_4/a.pt", "stat") in seen  # a scanned entry's stat(); os.stat
    assert ("step_4/c.pt", "compared 3 ab") in seen  # its stat and read inside `comparing`: the comparison only
    assert not {how for path, how in seen if path == "step_4/c.pt"} & {"stat", "read"}, seen
    assert not {path for path, _ in seen if path.startswith("..") or path == "after"}, seen
    assert restored.strip() == "True"  # os.stat is Python's own again


def test_states_that_answer_every_look_alike_are_one_and_the_others_are_not():
    from resilience.disk.observed import Observed, TreeIndex

    looks = Observed.of([("latest", "read"), ("step_4/a.pt", "read"), ("step_8/a.pt", "stat"), ("step_4", "list"),
                         ("zero_to_fp32.py", "kind")])
    base = {"latest": b"step_4", "step_4/a.pt": b"aaaa", "step_8/a.pt": b"bbbb", "zero_to_fp32.py": b"script"}
    dirs = {".", "step_4", "step_8"}

    def answers(changed: dict[str, bytes | None] | None = None) -> tuple:
        files = {**base, **(changed or {})}
        return looks.answers(TreeIndex.of({path: data for path, data in files.items() if data is not None}, dirs))

    same = answers()
    assert answers({"zero_to_fp32.py": b"torn"}) == same  # its kind only: still a file
    assert answers({"step_8/a.pt": b"zzzz"}) == same  # looked at for its size only: the same size
    assert answers({"step_8/a.pt": b"bb"}) != same  # torn: another size
    assert answers({"step_4/a.pt": b"aaab"}) != same  # read: its bytes
    assert answers({"latest": b"step_8"}) != same
    assert answers({"zero_to_fp32.py": None}) != same  # gone
    assert answers({"step_4/b.pt": b"new"}) != same  # a name in a listed directory


def test_a_path_the_restore_replaced_is_not_looked_at_again_and_a_truncating_open_sees_only_a_directory():
    from resilience.disk.observed import Observed, TreeIndex

    looks = Observed.of([("step_8/a.pt", "dir"), ("step_8/a.pt", "replaced"), ("step_8/a.pt", "read"),
                         ("step_8/b.pt", "read"), ("step_8/b.pt", "replaced")])
    dirs = {".", "step_8"}

    def answers(files: dict[str, bytes]) -> tuple:
        return looks.answers(TreeIndex.of(files, dirs))

    same = answers({"step_8/a.pt": b"aaaa", "step_8/b.pt": b"bbbb"})
    assert answers({"step_8/b.pt": b"bbbb"}) == same  # missing or torn, a.pt is created and truncated alike
    assert answers({"step_8/a.pt": b"a", "step_8/b.pt": b"bbbb"}) == same  # read after the restore replaced it
    assert answers({"step_8/a.pt": b"aaaa", "step_8/b.pt": b"bb"}) != same  # read before it was replaced
    assert looks.answers(TreeIndex.of({"step_8/b.pt": b"bbbb"}, dirs | {"step_8/a.pt"})) != same  # in the way

    scanned = Observed.of([("step_8", "scan")])  # glob's: names and kinds; an entry's stat() is a look of its own
    assert scanned.answers(TreeIndex.of({"step_8/a.pt": b"a"}, dirs)) == scanned.answers(
        TreeIndex.of({"step_8/a.pt": b"aaaa"}, dirs))
    assert scanned.answers(TreeIndex.of({}, dirs | {"step_8/a.pt"})) != scanned.answers(
        TreeIndex.of({"step_8/a.pt": b"aaaa"}, dirs))


def test_a_file_only_compared_with_a_known_one_answers_the_comparison_only():
    import hashlib

    from resilience.disk.observed import Observed, TreeIndex

    known = b"bbbb"
    looks = Observed.of([("step_8/a.pt", f"compared {len(known)} {hashlib.sha256(known).hexdigest()}")])

    def answers(content: bytes | None) -> tuple:
        return looks.answers(TreeIndex.of({} if content is None else {"step_8/a.pt": content}, {".", "step_8"}))

    assert answers(b"zzzz") == answers(b"bbb\0")  # other bytes at the same size, whichever
    assert answers(b"bb") == answers(b"b")  # another size, whichever
    assert len({answers(known), answers(b"zzzz"), answers(b"bb"), answers(None)}) == 4


def _restoring_every(nth: int, states: int):
    """A fake enumeration of ``states`` one-point states, of which every ``nth`` needs a restore
    (the others stand in), and an evaluate that counts the restores against its limit."""
    enumeration = SimpleNamespace(states=[SimpleNamespace(points=[i], index=i) for i in range(states)])
    restored: list[int] = []

    def evaluate(point, limit, index):
        if index % nth:
            return "stood in"
        if point not in restored:
            if len(restored) >= limit:
                return None
            restored.append(point)
        return "restored"

    return enumeration, evaluate, restored


def test_a_whole_enumeration_goes_past_the_budget_only_where_the_rest_fit_at_the_same_rate():
    enumeration, evaluate, restored = _restoring_every(8, 100)  # 13 restores: more than 10, within 15
    assert enumerate_within(enumeration, evaluate, 10, 15) and len(restored) == 13
    enumeration, evaluate, restored = _restoring_every(1, 100)  # every state restored: stop at the budget
    assert not enumerate_within(enumeration, evaluate, 10, 15) and len(restored) == 10
