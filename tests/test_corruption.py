"""Corruption at rest, misbehaving storage at restore, and the manifest wrapper, on real files and
real rank processes."""
from __future__ import annotations

import builtins
import errno
import io
import json
import os
from pathlib import Path

import pytest
import torch

from resilience.core.case import VerdictKind
from resilience.core.durable import write_atomically
from resilience.disk.read_interception import InterceptedReader, ReadInterceptor
from resilience.errors import ScenarioError
from resilience.faults.base import CaseEnvironment, Fault
from resilience.strategies.manifest import ManifestCheckpoint

from .harness_helpers import case_from, run_case

STATE = {"weight": torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64), "step": 8}


# -- the damage itself, on real files -----------------------------------------------------------
def damage(kind: str, tmp_path: Path, name: str = "a.pt", **params) -> tuple[bytes, bytes, dict]:
    path = tmp_path / name
    torch.save(STATE, path)
    before = path.read_bytes()
    fault = _fault(kind, **params)
    detail = fault.damage([path])
    return before, path.read_bytes() if path.exists() else b"", detail


def _fault(kind: str, **params):
    from resilience.core import registry

    case = case_from(fault={"kind": kind, "rank": 1, "step": 4, "file": params.pop("file", "*.pt"), **params})
    return registry.resolve("fault", kind)(case.fault)


def test_a_bit_flip_changes_exactly_one_bit_where_asked(tmp_path):
    before, after, detail = damage("bit_flip", tmp_path, offset=100, bit=3)
    assert len(after) == len(before) and detail["offsets"] == [100]
    assert [i for i in range(len(before)) if before[i] != after[i]] == [100]
    assert before[100] ^ after[100] == 1 << 3


def test_a_bit_flip_in_the_middle_of_tensor_data_loads_silently_with_torch(tmp_path):
    """The fact behind the bare strategies' SILENT verdicts: torch.load ignores the zip CRC-32."""
    before, after, detail = damage("bit_flip", tmp_path)
    assert detail["offsets"] == [len(before) // 2]
    loaded = torch.load(tmp_path / "a.pt", weights_only=True)
    assert not torch.equal(loaded["weight"], STATE["weight"])


def test_truncate_to_a_fraction_or_to_bytes(tmp_path):
    before, after, detail = damage("truncate", tmp_path, keep=0.25)
    assert len(after) == int(len(before) * 0.25) and after == before[:len(after)]
    before, after, _ = damage("truncate", tmp_path, name="b.pt", keep=4096)
    assert after == before[:4096]
    with pytest.raises(Exception, match="central directory|Invalid argument"):
        torch.load(tmp_path / "b.pt", weights_only=True)


def test_a_zero_block_overwrites_exactly_its_range(tmp_path):
    before, after, detail = damage("zero_block", tmp_path, offset=1000, length=300)
    assert detail["ranges"] == [[1000, 1300]]
    assert after[1000:1300] == bytes(300) and after[:1000] == before[:1000] and after[1300:] == before[1300:]


def test_a_missing_file_is_gone(tmp_path):
    _, after, _ = damage("missing_file", tmp_path)
    assert not (tmp_path / "a.pt").exists() and after == b""


def test_an_offset_past_the_end_is_an_error_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match="past the end of .*a.pt"):
        damage("bit_flip", tmp_path, offset=10**9)


def test_a_stale_pointer_names_the_older_tag_or_one_that_does_not_exist(tmp_path):
    for tag in ("global_step4", "global_step8"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "x.pt").write_bytes(b"x")
        os.utime(tmp_path / tag, ns=(int(tag[-1]) * 10**9,) * 2)
    latest = tmp_path / "latest"
    latest.write_text("global_step8")
    assert _fault("stale_pointer", file="latest").damage([latest]) == {"pointer": [["global_step8", "global_step4"]]}
    latest.write_text("global_step8")
    _fault("stale_pointer", file="latest", points_to="missing").damage([latest])
    assert not (tmp_path / latest.read_text()).exists()


def test_a_stale_iteration_tracker_names_the_older_iteration(tmp_path):
    """Megatron's tracker holds an iteration number, not a directory name."""
    for tag in ("iter_0000004", "iter_0000008"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "x.pt").write_bytes(b"x")
    os.utime(tmp_path / "iter_0000008", ns=(10**9,) * 2)  # the oldest mtime: still never its own iteration
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    tracker.write_text("8")
    assert _fault("stale_pointer", file=tracker.name).damage([tracker]) == {"pointer": [["8", "4"]]}


@pytest.mark.parametrize("fault, key, allowed", [
    ({"kind": "bit_flip", "bit": 8}, "fault.bit", "0..7"),
    ({"kind": "bit_flip", "offset": "end"}, "fault.offset", "middle"),
    ({"kind": "truncate", "keep": 1.0}, "fault.keep", "(0, 1)"),
    ({"kind": "zero_block", "length": 0}, "fault.length", "integer >= 1"),
    ({"kind": "duplicate_file"}, "fault.source", "glob"),
    ({"kind": "stale_pointer", "file": "lat*"}, "fault.file", "latest"),
    ({"kind": "stale_pointer", "file": "latest", "points_to": "newer"}, "fault.points_to", "older, missing"),
    ({"kind": "read_error", "fails_at": "close"}, "fault.fails_at", "read, open"),
    ({"kind": "slow_read"}, "fault.bytes_per_s", None),
    ({"kind": "bit_flip", "point": "write", "after_bytes": 5}, "fault.point", "returned"),
])
def test_fault_parameters_are_validated_by_the_loader(fault, key, allowed):
    with pytest.raises(ScenarioError) as info:
        case_from(fault={"rank": 1, "step": 4, **fault})
    assert key in str(info.value) and "tests/generated.scenario.yaml" in str(info.value)
    if allowed:
        assert allowed in str(info.value)


@pytest.mark.parametrize("strategy, key, text", [
    ({"name": "manifest"}, "strategy.options.inner", "missing"),
    ({"name": "manifest", "options": {"inner": "none"}}, "strategy.options.inner", "cannot load a chosen step"),
    ({"name": "manifest", "options": {"inner": "no.such:Thing"}}, "strategy.options.inner", "cannot import"),
    ({"name": "manifest", "options": {"inner": "torch.rank0", "inner_options": {"check_version": "yes"}}},
     "strategy.options.inner_options.check_version", "True, False"),
])
def test_the_manifest_wrapper_is_validated_by_the_loader(strategy, key, text):
    with pytest.raises(ScenarioError) as info:
        case_from(strategy=strategy)
    assert key in str(info.value) and text in str(info.value)


# -- read interception ----------------------------------------------------------------------------
class FailReads:
    def __init__(self, at: str):
        self.at, self.reads = at, 0

    def wants_read(self, relative):
        return relative.endswith(".pt")

    def on_open_read(self, path, relative):
        if self.at == "open":
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    def on_read(self, file, nbytes):
        self.reads += 1
        if self.at == "read":
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(file.path))


@pytest.fixture
def interceptor_factory():
    installed = []

    def make(root, listener):
        interceptor = ReadInterceptor(root, [listener])
        interceptor.install()
        installed.append(interceptor)
        return interceptor

    real_open = builtins.open
    yield make
    for interceptor in reversed(installed):
        interceptor.uninstall()
    assert builtins.open is real_open and io.open is real_open


@pytest.mark.parametrize("at", ["open", "read"])
@pytest.mark.parametrize("mmap", [False, True])
def test_torch_load_given_a_path_meets_the_read_fault(tmp_path, interceptor_factory, at, mmap):
    torch.save(STATE, tmp_path / "a.pt")
    interceptor_factory(tmp_path, FailReads(at))
    with pytest.raises(OSError) as info:
        torch.load(tmp_path / "a.pt", weights_only=True, mmap=mmap)
    chain = [info.value, info.value.__cause__, info.value.__context__]
    assert any(isinstance(e, OSError) and e.errno == errno.EIO for e in chain if e is not None)


def test_reads_go_through_the_wrapper_and_return_the_real_bytes(tmp_path, interceptor_factory):
    torch.save(STATE, tmp_path / "a.pt")
    (tmp_path / "latest").write_text("global_step8")
    listener = FailReads("never")
    interceptor_factory(tmp_path, listener)
    loaded = torch.load(tmp_path / "a.pt", weights_only=True)
    assert torch.equal(loaded["weight"], STATE["weight"]) and listener.reads > 0
    with open(tmp_path / "a.pt", "rb") as f:
        assert isinstance(f, InterceptedReader)
    with open(tmp_path / "latest") as f:  # not wanted: the real file object
        assert not isinstance(f, InterceptedReader) and f.read() == "global_step8"
    with open(tmp_path / "a.pt", "ab") as f:  # writes are not this layer's business
        assert not isinstance(f, InterceptedReader)


# -- the manifest ---------------------------------------------------------------------------------
def test_a_manifest_is_written_atomically(tmp_path):
    target = tmp_path / "step_00000004.json"
    write_atomically(target, json.dumps({"a": 1}))
    assert json.loads(target.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == [target.name]


class FlipEveryShard(Fault):
    """The operator's hands between the runs: one bit flipped in rank 1's file of every step."""

    kind = "tests.test_corruption:FlipEveryShard"
    needs_trigger = False

    def heal(self, env: CaseEnvironment) -> None:
        for path in sorted(env.checkpoint_dir.glob("step_*/ckpt_rank_1.pt")):
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 1
            path.write_bytes(bytes(data))


def test_bare_per_rank_restores_a_flipped_bit_silently_and_the_manifest_falls_back(tmp_path):
    fault = {"kind": "bit_flip", "rank": 1, "step": 8, "file": "step_00000008/*_rank_1.pt"}
    workload = {"steps": 12}
    bare = run_case(tmp_path, workload=workload, fault=fault)
    assert bare.verdict.kind is VerdictKind.SILENT and bare.verdict.restored_step == 8
    assert any("differs from the reference" in f for f in bare.verdict.findings)
    wrapped = run_case(tmp_path, workload=workload, fault=fault,
                       strategy={"name": "manifest", "options": {"inner": "torch.per_rank"}},
                       expect={"outcome": "recovers", "fallback_ok": True})
    assert wrapped.verdict.kind is VerdictKind.RECOVERED and wrapped.verdict.restored_step == 4
    restart = wrapped.phases[2]
    assert "step 8: step_00000008/ckpt_rank_1.pt: sha256" in restart.ranks[0].stderr_tail
    (fired,) = wrapped.phases[1].fault_events
    assert fired["files"] == ["step_00000008/ckpt_rank_1.pt"] and fired["ends_process"]
    assert list(tmp_path.iterdir()) == []


def test_the_manifest_refuses_loudly_when_no_checkpoint_verifies(tmp_path):
    result = run_case(tmp_path, strategy={"name": "manifest", "options": {"inner": "torch.per_rank"}},
                      fault={"kind": FlipEveryShard.kind}, expect="fails_loudly")
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    error = result.verdict.first_error
    assert error.phase == "restart" and "no checkpoint verifies against its manifest" in error.message
    assert "step 8:" in error.message and "step 4:" in error.message


def test_a_read_only_remount_is_real_and_removed_afterwards(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("read_only via mount needs root")
    result = run_case(tmp_path, workload={"steps": 12}, fault={"kind": "read_only", "rank": 1, "step": 8},
                      expect="fails_loudly")
    assert result.verdict.kind is VerdictKind.LOUD
    assert "Read-only file system" in result.verdict.first_error.summary()
    assert result.verdict.restored_step == 8  # reading worked; the next save did not
    assert str(tmp_path) not in Path("/proc/mounts").read_text()
    assert list(tmp_path.iterdir()) == []


def test_a_straggler_writes_during_the_restart_and_is_killed_by_pid_afterwards(tmp_path):
    # the ranks restore different steps, so their collectives no longer pair up: a short timeout
    result = run_case(tmp_path, keep=True, workload={"steps": 12}, timeouts={"collective": 10},
                      fault={"kind": "straggler", "rank": 1, "step": 8, "file": "step_00000008/*_rank_1.pt",
                             "source": "step_00000004/*_rank_1.pt", "seconds": 60})
    try:
        assert result.verdict.kind is VerdictKind.SILENT, result.verdict.findings
        assert any("ranks restored different steps: {0: 8, 1: 4}" in f for f in result.verdict.findings)
        (fired,) = result.phases[1].fault_events
        pid = fired["straggler_pid"]
        assert not Path(f"/proc/{pid}").exists() or " Z " in Path(f"/proc/{pid}/stat").read_text()
        assert (result.work_dir / "straggler.pids").read_text().split() == [str(pid)]
        # released between the runs: its first write landed before any rank of the restart started
        wrote = (result.work_dir / "straggler.wrote").stat().st_mtime
        first_event = min(e["time"] for record in result.phases[2].ranks for e in record.events)
        assert wrote <= first_event + 0.05  # a file's mtime is the kernel's coarse clock
    finally:
        import shutil

        shutil.rmtree(result.work_dir)
    assert list(tmp_path.iterdir()) == []


def test_a_straggler_gone_before_its_first_write_is_a_harness_error_at_once(tmp_path):
    import subprocess
    import time

    from resilience.errors import HarnessError
    from resilience.faults.at_rest.straggler import PIDS_FILE, Straggler

    case = case_from(fault={"kind": "straggler", "rank": 1, "step": 8, "file": "step_00000008/*_rank_1.pt",
                            "source": "step_00000004/*_rank_1.pt"})
    exited = subprocess.Popen(["true"])
    exited.wait()
    (tmp_path / PIDS_FILE).write_text(f"{exited.pid}\n")
    env = CaseEnvironment(case=case, case_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")
    started = time.monotonic()
    with pytest.raises(HarnessError, match="exited before its first write"):
        Straggler(case.fault).heal(env)
    assert time.monotonic() - started < 60  # not the 120 s a silent helper gets
    Straggler(case.fault).heal(CaseEnvironment(case=case, case_dir=tmp_path / "unfired", checkpoint_dir=tmp_path))


def test_tag_mismatch_needs_a_strategy_that_names_its_tag():
    with pytest.raises(ScenarioError) as info:
        case_from(strategy="torch.per_rank", fault={"kind": "tag_mismatch", "rank": 1, "step": 4})
    assert "tag_for" in str(info.value) and "strategy" in str(info.value)
    with pytest.raises(ScenarioError) as info:
        case_from(strategy="deepspeed.zero2", fault={"kind": "tag_mismatch", "rank": 1, "step": 4, "skew": 0})
    assert "fault.skew" in str(info.value)


def test_keep_last_retention_is_validated():
    with pytest.raises(ScenarioError) as info:
        case_from(strategy={"name": "torch.per_rank", "options": {"keep_last": 0}})
    assert "strategy.options.keep_last" in str(info.value) and "integer >= 1" in str(info.value)
    with pytest.raises(ScenarioError) as info:
        case_from(strategy={"name": "manifest",
                            "options": {"inner": "torch.rank0", "inner_options": {"keep_last": "2"}}})
    assert "strategy.options.inner_options.keep_last" in str(info.value)


def test_inner_retention_before_the_barrier_costs_the_fallback_and_the_manifest_keeps_it(tmp_path):
    fault = {"kind": "kill", "rank": 1, "step": 8, "phase": "save", "point": "write", "file": "*_rank_1.pt",
             "after_bytes": 4096}
    inner = run_case(tmp_path, keep=True, workload={"steps": 12}, fault=fault, expect="fails_loudly",
                     strategy={"name": "manifest", "options": {"inner": "torch.per_rank",
                                                                "inner_options": {"keep_last": 1}}})
    try:
        assert inner.verdict.kind is VerdictKind.LOUD
        assert "no checkpoint verifies" in inner.verdict.first_error.message
        assert "step_00000004/ckpt_rank_0.pt: FileNotFoundError" in inner.verdict.first_error.message
    finally:
        import shutil

        shutil.rmtree(inner.work_dir)
    outer = run_case(tmp_path, workload={"steps": 12}, fault=fault,
                     strategy={"name": "manifest", "options": {"inner": "torch.per_rank", "keep_last": 1}})
    assert outer.verdict.kind is VerdictKind.RECOVERED and outer.verdict.restored_step == 4


def test_a_wrapped_strategy_whose_library_is_missing_is_skipped_and_keyed_on_the_inner_source(tmp_path, monkeypatch):
    from resilience.errors import StrategyUnavailable
    from resilience.run.harness import Harness
    from resilience.strategies.deepspeed.engine import ZeroTrainedWorkload
    from resilience.strategies.deepspeed.zero import Zero2
    from resilience.strategies.manifest import ManifestCheckpoint

    options = {"inner": "deepspeed.zero2"}
    assert ManifestCheckpoint.trained_by(options) == (Zero2, ZeroTrainedWorkload)
    monkeypatch.setattr(Zero2, "requires", {"deepspeed_is_not_here": "pip install 'resilience[deepspeed]'"})
    with pytest.raises(StrategyUnavailable, match="deepspeed_is_not_here is not installed"):
        Harness(work_root=tmp_path).run(case_from(strategy={"name": "manifest", "options": options}))
    assert list(tmp_path.iterdir()) == []


def test_read_only_via_interception_refuses_python_writes_like_the_kernel(tmp_path):
    result = run_case(tmp_path, workload={"steps": 12}, expect="fails_loudly",
                      fault={"kind": "read_only", "via": "interception", "rank": 1, "step": 8})
    assert result.verdict.kind is VerdictKind.LOUD and result.verdict.restored_step == 8
    assert "[Errno 30] Read-only file system" in result.verdict.first_error.summary()
    assert result.verdict.first_error.phase == "restart"


class SizeOnlyManifest(ManifestCheckpoint):
    """Deliberately broken: checks each file's size and never its content."""

    def _verify(self, document):
        location = self.context.checkpoint_dir / document["location"]
        return [name for name in self._share(sorted(document["files"]))
                if not (location / name).exists()
                or (location / name).stat().st_size != document["files"][name]["size"]]


def test_a_manifest_that_checks_sizes_only_is_caught_silent_by_a_bit_flip(tmp_path):
    result = run_case(tmp_path, workload={"steps": 12},
                      strategy={"name": "tests.test_corruption:SizeOnlyManifest",
                                "options": {"inner": "torch.per_rank"}},
                      fault={"kind": "bit_flip", "rank": 1, "step": 8, "file": "step_00000008*_rank_1.pt"})
    assert result.verdict.kind is VerdictKind.SILENT and result.verdict.restored_step == 8
