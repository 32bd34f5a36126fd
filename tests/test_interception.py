"""The interception layer and the faults that act through it, on real files and real processes.

Kill cases run in a forked child (the test process already has torch imported, so a fork costs
milliseconds where a fresh interpreter spends seconds importing torch); the child installs the
interceptor, arms a real `Kill` and saves, and the parent checks how it died and what it left on
disk. DiskFull raises instead of killing, so it runs in-process, with the patches removed by a
fixture afterwards.
"""
from __future__ import annotations

import builtins
import errno
import io
import json
import multiprocessing
import os
import pickle
import signal
import struct
import zipfile
from pathlib import Path

import pytest
import torch
import torch.serialization

from resilience.core.case import FaultSpec, Trigger
from resilience.disk.interception import InterceptedFile, Interceptor
from resilience.faults.base import Clock, RankEnvironment
from resilience.faults.process.kill import Kill
from resilience.faults.write_path.disk_full import DiskFull

FORK = multiprocessing.get_context("fork")
MARKER = "returned.txt"  # the child writes it after the save returns: proof the save was not cut short


def checkpoint() -> dict:
    """A deterministic state dict with one 1 MiB tensor, so offsets can fall inside tensor data."""
    return {"weight": torch.arange(512 * 512, dtype=torch.float32).reshape(512, 512),
            "bias": torch.arange(512, dtype=torch.float64), "step": 8}


def saved_bytes(obj: dict) -> bytes:
    """What torch.save writes to a file object (the route an intercepted path save takes)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def saved_by_path(obj: dict) -> bytes:
    """What torch.save writes given a path itself (from C++): its records are named after the file."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(obj, os.path.join(tmp, "x.pt"))
        with open(os.path.join(tmp, "x.pt"), "rb") as f:
            return f.read()


REFERENCE = saved_bytes(checkpoint())
PATH_REFERENCE = saved_by_path(checkpoint())  # a file no fault wants is left to torch's own writer


def largest_record_span(data: bytes) -> tuple[int, int]:
    """(start, end) of the largest record's payload inside a torch zip archive."""
    info = max(zipfile.ZipFile(io.BytesIO(data)).infolist(), key=lambda i: i.file_size)
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    return start, start + info.file_size


WEIGHT_START, WEIGHT_END = largest_record_span(REFERENCE)
MID_TENSOR = (WEIGHT_START + WEIGHT_END) // 2 + 3  # odd, and not on any write boundary torch uses


def assert_equal_state(loaded: dict, expected: dict) -> None:
    assert loaded.keys() == expected.keys()
    assert torch.equal(loaded["weight"], expected["weight"])
    assert torch.equal(loaded["bias"], expected["bias"])
    assert loaded["step"] == expected["step"]


def trigger(point: str, after_bytes: int | None = None, *, rank: int = 0, step: int = 8, phase: str = "save",
            file: str = "*.pt") -> Trigger:
    return Trigger(rank=rank, step=step, phase=phase, point=point, file=file, after_bytes=after_bytes)


def arm(fault, root: Path, emit, *, rank: int = 0, step: int = 8, phase: str = "save"):
    fault.arm(RankEnvironment(rank=rank, world_size=1, checkpoint_dir=root,
                              clock=Clock(phase=phase, step=step), emit=emit))
    return fault


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- kill, in a child process -----------------------------------------------------------------------

def _child_save(root: str, events: str, trig: Trigger, clock: dict, rank: int, how: str) -> None:
    """Runs in the forked child: arm a Kill, install the interceptor, save, mark that save returned."""
    # The parent's OpenMP pool did not survive the fork (a parallel op would wait on it forever);
    # with one thread, ATen runs every op inline and never touches the pool.
    torch.set_num_threads(1)
    log = open(events, "a", encoding="utf-8")  # opened before interception: it is never a checkpoint file

    def emit(event, **fields):
        log.write(json.dumps({"event": event, **fields}) + "\n")
        log.flush()

    root_path = Path(root)
    fault = arm(Kill(FaultSpec(kind="kill", trigger=trig, params={})), root_path, emit, rank=rank, **clock)
    Interceptor(root_path, [fault]).install()
    target = root_path / "x.pt"
    if how == "path":
        torch.save(checkpoint(), target)
    elif how == "fsync":  # the usual durable-save idiom: write, flush, fsync, close
        with open(target, "wb") as f:
            torch.save(checkpoint(), f)
            f.flush()
            os.fsync(f.fileno())
    with open(root_path / MARKER, "w") as f:  # not *.pt: the fault ignores it
        f.write("yes")


def run_child(tmp_path: Path, trig: Trigger, *, rank: int = 0, step: int = 8, phase: str = "save",
              how: str = "path") -> tuple[int, Path, list[dict]]:
    """Fork, save under an armed Kill, wait; returns (exit code, checkpoint root, events)."""
    root, events = tmp_path / "ckpt", tmp_path / "events.jsonl"
    root.mkdir()
    child = FORK.Process(target=_child_save, args=(str(root), str(events), trig,
                                                   {"step": step, "phase": phase}, rank, how))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the child neither finished nor died within 60 s")
    return child.exitcode, root, read_events(events)


@pytest.mark.parametrize("after_bytes", [0, 1, 4096, 100_000, MID_TENSOR],
                         ids=["0", "1", "4096", "100000", "mid_tensor"])
def test_kill_at_byte_offset_leaves_exactly_that_prefix(tmp_path, after_bytes):
    """A kill at `after_bytes` must leave a torn file of exactly that many bytes: the first bytes
    of what the full save would have written, nothing buffered lost, nothing after it."""
    assert after_bytes < len(REFERENCE)
    code, root, events = run_child(tmp_path, trigger("write", after_bytes))

    assert code == -signal.SIGKILL
    path = root / "x.pt"
    assert path.stat().st_size == after_bytes
    assert path.read_bytes() == REFERENCE[:after_bytes]
    assert not (root / MARKER).exists()
    assert events == [{"event": "fault_fired", "kind": "kill", "step": 8, "phase": "save", "point": "write",
                       "file": "x.pt", "offset": after_bytes, "ends_process": True}]
    with pytest.raises((RuntimeError, EOFError, pickle.UnpicklingError)):  # torn zip, empty, or not a zip
        torch.load(path, weights_only=True)


def test_kill_mid_tensor_offset_is_inside_tensor_data():
    """Guards the parametrization above: the mid_tensor offset really cuts a tensor's payload."""
    assert WEIGHT_END - WEIGHT_START == 512 * 512 * 4
    assert WEIGHT_START < MID_TENSOR < WEIGHT_END
    assert WEIGHT_START < 100_000 < WEIGHT_END


def test_kill_at_open_leaves_an_empty_file(tmp_path):
    """Point open: the process dies right after the file is created, before any byte."""
    code, root, events = run_child(tmp_path, trigger("open"))

    assert code == -signal.SIGKILL
    assert (root / "x.pt").exists() and (root / "x.pt").stat().st_size == 0
    assert not (root / MARKER).exists()
    assert [(e["event"], e["point"], e["offset"]) for e in events] == [("fault_fired", "open", 0)]


def test_kill_at_close_leaves_a_complete_loadable_file(tmp_path):
    """Point close: the file is whole and loads, yet the process dies before the save returns."""
    code, root, events = run_child(tmp_path, trigger("close"))

    assert code == -signal.SIGKILL
    path = root / "x.pt"
    assert path.read_bytes() == REFERENCE
    assert_equal_state(torch.load(path, weights_only=True), checkpoint())
    assert not (root / MARKER).exists()
    assert [(e["event"], e["point"], e["offset"]) for e in events] == [("fault_fired", "close", len(REFERENCE))]


def test_kill_at_fsync_keeps_the_flushed_bytes(tmp_path):
    """Point fsync: the process dies just before fsync; everything flushed before stays on disk."""
    code, root, events = run_child(tmp_path, trigger("fsync"), how="fsync")

    assert code == -signal.SIGKILL
    assert (root / "x.pt").read_bytes() == REFERENCE
    assert not (root / MARKER).exists()
    assert [(e["event"], e["point"], e["offset"]) for e in events] == [("fault_fired", "fsync", len(REFERENCE))]


@pytest.mark.parametrize("trig, where", [
    (trigger("write", 4096, step=7), {}),
    (trigger("write", 4096), {"step": 9}),
    (trigger("write", 4096), {"phase": "train"}),
    (trigger("write", 4096), {"phase": "idle"}),
    (trigger("write", 4096), {"rank": 1}),
    (trigger("write", 4096, file="*.bin"), {}),
    (trigger("write", 4096, file="sub/*.pt"), {}),
    (trigger("write", len(REFERENCE)), {}),  # the file never grows past the offset
    (trigger("open", step=7), {}),
    (trigger("close", rank=1), {}),
], ids=["trigger_step", "clock_step", "phase_train", "phase_idle", "rank", "pattern_ext", "pattern_dir",
        "offset_at_end", "open_other_step", "close_other_rank"])
def test_kill_does_not_fire_outside_its_trigger(tmp_path, trig, where):
    """Any mismatch of step, phase, rank, file pattern or offset: the save completes untouched."""
    code, root, events = run_child(tmp_path, trig, **where)

    assert code == 0
    assert events == []
    assert (root / MARKER).exists()
    assert (root / "x.pt").read_bytes() in (REFERENCE, PATH_REFERENCE)
    assert_equal_state(torch.load(root / "x.pt", weights_only=True), checkpoint())


# -- in-process interception ----------------------------------------------------------------------

@pytest.fixture
def root(tmp_path) -> Path:
    path = tmp_path / "ckpt"
    path.mkdir()
    return path


@pytest.fixture
def install():
    """install(root, listeners) -> Interceptor, always uninstalled at teardown."""
    installed: list[Interceptor] = []
    saved = (builtins.open, io.open, torch.save, torch.serialization.save, os.fsync)

    def _install(root: Path, listeners, staging: Path | None = None) -> Interceptor:
        interceptor = Interceptor(root, listeners, staging=staging)
        interceptor.install()
        installed.append(interceptor)
        return interceptor

    yield _install
    for interceptor in reversed(installed):
        interceptor.uninstall()
    assert (builtins.open, io.open, torch.save, torch.serialization.save, os.fsync) == saved


class Recorder:
    """A listener that only records what it is told, to observe which files are intercepted."""

    def __init__(self):
        self.calls: list[tuple] = []

    def on_open(self, file):
        self.calls.append(("open", file.relative, file.offset))

    def on_write(self, file, data, nbytes):
        self.calls.append(("write", file.relative, file.offset, nbytes))

    def on_fsync(self, file):
        self.calls.append(("fsync", file.relative, file.offset))

    def before_close(self, file):
        self.calls.append(("before_close", file.relative, file.offset))

    def after_close(self, file):
        self.calls.append(("after_close", file.relative, file.offset))


def disk_full(root: Path, point: str, budget: int, events: list, **clock) -> DiskFull:
    fault = DiskFull(FaultSpec(kind="disk_full", trigger=trigger(point, budget), params={"via": "quota"}))
    return arm(fault, root, lambda event, **fields: events.append({"event": event, **fields}), **clock)


def assert_no_space(excinfo) -> None:
    assert isinstance(excinfo.value, OSError) and excinfo.value.errno == errno.ENOSPC


def enospc_in_chain(exc: BaseException) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def test_disk_full_at_write_cuts_the_crossing_write_and_stays_full(root, install):
    """Point write: the write crossing the budget puts exactly the budget on disk and raises ENOSPC,
    like a local filesystem; every later write, in this file or another, fails too."""
    events: list = []
    install(root, [disk_full(root, "write", 1000, events)])

    with open(root / "a.pt", "wb") as f:
        assert f.write(b"a" * 600) == 600
        with pytest.raises(OSError) as first:
            f.write(b"b" * 600)
        assert_no_space(first)
        with pytest.raises(OSError) as later:
            f.write(b"c")
        assert_no_space(later)
    assert (root / "a.pt").read_bytes() == b"a" * 600 + b"b" * 400

    with pytest.raises(OSError) as other_file:
        with open(root / "b.pt", "wb") as f:
            f.write(b"x")
    assert_no_space(other_file)
    assert (root / "b.pt").stat().st_size == 0
    assert [(e["event"], e["kind"], e["point"], e["file"], e["offset"]) for e in events] == [
        ("fault_fired", "disk_full", "write", "a.pt", 1000)]


def test_disk_full_at_write_during_torch_save(root, install):
    """torch.save given a path sees the ENOSPC (wrapped by torch) and leaves the budget's bytes."""
    events: list = []
    install(root, [disk_full(root, "write", 100_000, events)])

    with pytest.raises((OSError, RuntimeError)) as excinfo:
        torch.save(checkpoint(), root / "x.pt")
    assert enospc_in_chain(excinfo.value)
    assert (root / "x.pt").read_bytes() == REFERENCE[:100_000]
    assert [e["offset"] for e in events] == [100_000]
    with pytest.raises(RuntimeError):
        torch.load(root / "x.pt", weights_only=True)


@pytest.mark.parametrize("where", [{"rank": 1}, {"step": 7}, {"phase": "train"}, {"phase": "idle"}],
                         ids=["other_rank", "earlier_step", "train", "idle"])
def test_disk_full_does_not_count_outside_its_trigger(root, install, where):
    """Another rank, an earlier step, or outside the save: the budget is not spent."""
    events: list = []
    install(root, [disk_full(root, "write", 10, events, **where)])
    torch.save(checkpoint(), root / "x.pt")
    assert (root / "x.pt").read_bytes() == PATH_REFERENCE  # not wanted: torch wrote it itself
    assert events == []


def test_disk_full_counts_only_matching_files_and_keeps_counting_after_the_save(root, install):
    """Files outside the pattern never spend the budget; steps after the trigger still do (the
    disk stays full for the rest of the run)."""
    events: list = []
    fault = disk_full(root, "write", 10, events)
    install(root, [fault])
    (root / "meta.json").write_bytes(b"m" * 100)  # not *.pt
    assert (root / "meta.json").stat().st_size == 100
    assert events == []

    fault.env.clock.phase, fault.env.clock.step = "train", 9
    with pytest.raises(OSError) as excinfo:
        (root / "later.pt").write_bytes(b"x" * 11)
    assert_no_space(excinfo)
    assert (root / "later.pt").read_bytes() == b"x" * 10


def test_disk_full_at_close_truncates_and_raises_on_close(root, install):
    """Point close: every write seems to succeed (as on NFS); close raises ENOSPC and the file is
    cut back to the budget."""
    events: list = []
    install(root, [disk_full(root, "close", 1000, events)])

    f = open(root / "a.pt", "wb")
    for chunk in (b"a" * 600, b"b" * 600, b"c" * 600):
        assert f.write(chunk) == 600
    with pytest.raises(OSError) as excinfo:
        f.close()
    assert_no_space(excinfo)
    assert f.closed
    assert (root / "a.pt").read_bytes() == b"a" * 600 + b"b" * 400
    assert [(e["point"], e["offset"]) for e in events] == [("close", 1000)]


def test_disk_full_at_close_during_torch_save(root, install):
    """torch.save given a path fails at close with ENOSPC; the file is the budget's prefix."""
    install(root, [disk_full(root, "close", 100_000, [])])

    with pytest.raises(OSError) as excinfo:
        torch.save(checkpoint(), root / "x.pt")
    assert_no_space(excinfo)
    assert (root / "x.pt").read_bytes() == REFERENCE[:100_000]


def test_disk_full_at_fsync_raises_from_fsync(root, install):
    """Point fsync: writes and flush succeed, os.fsync raises ENOSPC with the file cut back."""
    events: list = []
    install(root, [disk_full(root, "fsync", 1000, events)])

    with open(root / "a.pt", "wb") as f:
        f.write(b"a" * 1800)
        f.flush()
        with pytest.raises(OSError) as excinfo:
            os.fsync(f.fileno())
        assert_no_space(excinfo)
        assert (root / "a.pt").stat().st_size == 1000
    assert (root / "a.pt").read_bytes() == b"a" * 1000  # the error surfaced once; close succeeds
    assert [(e["point"], e["offset"]) for e in events] == [("fsync", 1000)]


def test_disk_full_under_budget_changes_nothing(root, install):
    """A save that fits the budget completes, loads, and fires nothing."""
    events: list = []
    install(root, [disk_full(root, "close", len(REFERENCE), events)])
    torch.save(checkpoint(), root / "x.pt")
    assert (root / "x.pt").read_bytes() == REFERENCE
    assert events == []


# -- scope of interception ------------------------------------------------------------------------

def test_only_writes_under_the_root_are_wrapped(root, install, tmp_path):
    """Files elsewhere (even a sibling whose name starts like the root) and read-mode opens under
    the root stay plain file objects: the layer must not see or slow down anything else."""
    recorder = Recorder()
    install(root, [recorder])
    (root / "x.pt").write_bytes(b"data")
    recorder.calls.clear()
    sibling = tmp_path / "ckpt2"
    sibling.mkdir()

    for path in (tmp_path / "elsewhere.pt", sibling / "x.pt", root.parent / "x.pt"):
        with open(path, "wb") as f:
            assert not isinstance(f, InterceptedFile)
            assert isinstance(f, io.BufferedWriter)
    for mode in ("rb", "r"):
        with open(root / "x.pt", mode) as f:
            assert not isinstance(f, InterceptedFile)
    with io.open(root / "x.pt", "rb") as f:
        assert not isinstance(f, InterceptedFile)
    torch.save({"a": torch.ones(3)}, tmp_path / "outside.pt")
    assert recorder.calls == []


@pytest.mark.parametrize("mode", ["wb", "ab", "r+b", "xb", "w", "a+"])
def test_write_modes_under_the_root_are_wrapped(root, install, mode):
    """Every mode that can write is intercepted, and writes land on disk unchanged."""
    recorder = Recorder()
    install(root, [recorder])
    path = root / "sub" / "f.bin"
    path.parent.mkdir()
    if mode.startswith(("a", "r")):
        path.write_bytes(b"old")
    recorder.calls.clear()
    with open(path, mode) as f:
        assert isinstance(f, InterceptedFile)
        f.write("new" if "b" not in mode else b"new")
    assert recorder.calls[0][:2] == ("open", "sub/f.bin")
    assert [c[0] for c in recorder.calls] == ["open", "write", "before_close", "after_close"]
    expected = {"wb": b"new", "w": b"new", "xb": b"new", "ab": b"oldnew", "a+": b"oldnew", "r+b": b"new"}
    assert path.read_bytes() == expected[mode]


def test_pathlib_and_io_open_are_intercepted(root, install):
    """Path.write_bytes / Path.open go through io.open, which must be patched too."""
    recorder = Recorder()
    install(root, [recorder])
    (root / "a.pt").write_bytes(b"12345")
    with (root / "b.pt").open("wb") as f:
        assert isinstance(f, InterceptedFile)
    with io.open(root / "c.pt", "wb") as f:
        assert isinstance(f, InterceptedFile)
    assert [c[1] for c in recorder.calls if c[0] == "open"] == ["a.pt", "b.pt", "c.pt"]
    assert ("after_close", "a.pt", 5) in recorder.calls


def test_file_names_starting_with_two_dots_are_inside_the_root(root, install):
    """'..name' directly under the root is a file in the root, not its parent directory."""
    recorder = Recorder()
    interceptor = install(root, [recorder])
    assert interceptor.relative(root / "..x.pt") == "..x.pt"
    assert interceptor.relative(root / ".." / "x.pt") is None
    assert interceptor.relative(root) is None
    with open(root / "..x.pt", "wb") as f:
        assert isinstance(f, InterceptedFile)


def test_a_file_dropped_without_close_is_flushed_and_closed_as_usual(root, install):
    """`json.dump(x, open(p, "w"))` relies on the file object being collected, flushed and closed at
    once. The interceptor must not keep it alive: its bytes would sit in a buffer, absent from disk
    (and lost for good if a kill came later), and its descriptor would leak."""
    interceptor = install(root, [Recorder()])
    json.dump({"step": 8}, open(root / "meta.json", "w"))
    assert json.loads((root / "meta.json").read_text()) == {"step": 8}
    assert len(interceptor.open_files) == 0


def test_hooks_see_exact_offsets_in_order(root, install):
    """The listener contract: open, then each write at its offset, fsync, before/after close."""
    recorder = Recorder()
    install(root, [recorder])
    with open(root / "a.pt", "wb") as f:
        f.write(b"abc")
        f.write(memoryview(b"defgh"))
        f.flush()
        os.fsync(f)  # a file object, not a number, is accepted too
    assert recorder.calls == [("open", "a.pt", 0), ("write", "a.pt", 0, 3), ("write", "a.pt", 3, 5),
                              ("fsync", "a.pt", 8), ("before_close", "a.pt", 8), ("after_close", "a.pt", 8)]


# -- interception does not change the bytes ---------------------------------------------------------

def test_intercepted_torch_save_writes_the_same_bytes(root, install, tmp_path):
    """With no fault, an intercepted save is byte-for-byte what torch writes to a plain file object,
    whether the save is given a path or the InterceptedFile itself."""
    obj = checkpoint()
    with open(tmp_path / "plain.pt", "wb") as f:  # before install: a plain file object
        torch.save(obj, f)
    plain = (tmp_path / "plain.pt").read_bytes()
    assert plain == REFERENCE

    recorder = Recorder()
    install(root, [Recorder()])
    torch.save(obj, root / "by_path.pt")
    with open(root / "by_handle.pt", "wb") as f:
        assert isinstance(f, InterceptedFile)
        torch.save(obj, f)
    assert (root / "by_path.pt").read_bytes() == plain
    assert (root / "by_handle.pt").read_bytes() == plain

    install(root, [recorder])  # a second, observing layer on top: still the same bytes
    torch.save(obj, root / "observed.pt")
    assert (root / "observed.pt").read_bytes() == plain
    writes = [c for c in recorder.calls if c[0] == "write"]
    assert sum(c[3] for c in writes) == len(plain)
    assert recorder.calls[-1] == ("after_close", "observed.pt", len(plain))


def test_intercepted_path_save_differs_from_a_native_path_save_only_in_the_archive_name(root, install, tmp_path):
    """torch.save to a path writes from C++ and names the archive's records after the file ("x/..."),
    while a save to a file object names them "archive/...": the interceptor, which must hand torch a
    file object, cannot avoid that. Every record's payload is the same, and the file loads the same."""
    obj = checkpoint()
    native = tmp_path / "native"
    native.mkdir()
    torch.save(obj, native / "x.pt")
    install(root, [Recorder()])
    torch.save(obj, root / "x.pt")

    def records(path: Path) -> dict[str, bytes]:
        archive = zipfile.ZipFile(path)
        return {name.split("/", 1)[1]: archive.read(name) for name in archive.namelist()}

    assert zipfile.ZipFile(native / "x.pt").namelist()[0].startswith("x/")
    assert zipfile.ZipFile(root / "x.pt").namelist()[0].startswith("archive/")
    assert records(native / "x.pt") == records(root / "x.pt")
    assert_equal_state(torch.load(root / "x.pt", weights_only=True), torch.load(native / "x.pt", weights_only=True))


class NotInterested(Recorder):
    def wants(self, relative):
        return False


def test_a_file_no_listener_wants_is_left_to_torch_itself(root, install, tmp_path):
    """No fault armed for a file: torch.save given a path writes it from C++ exactly as without the
    harness (byte-identical), and open() returns the plain file object."""
    obj = checkpoint()
    assert PATH_REFERENCE[:64] != REFERENCE[:64]  # the two routes are distinguishable
    listener = NotInterested()
    install(root, [listener])
    torch.save(obj, root / "x.pt")
    assert (root / "x.pt").read_bytes() == PATH_REFERENCE
    with open(root / "y.bin", "wb") as f:
        assert not isinstance(f, InterceptedFile)
    assert listener.calls == []


# -- the staging directory ($TMPDIR) ----------------------------------------------------------------

def test_files_staged_in_tmpdir_are_named_with_the_staging_prefix(root, install, tmp_path):
    """Lightning's atomic save writes its file in $TMPDIR and moves it into place: with a staging
    directory, those writes reach listeners as '$TMPDIR/<name>'; other files outside stay plain."""
    staging = tmp_path / "rank-tmp"
    staging.mkdir()
    recorder = Recorder()
    install(root, [recorder], staging=staging)
    with open(staging / "tmpabc", "wb") as f:
        assert isinstance(f, InterceptedFile)
        f.write(b"12345")
    with open(tmp_path / "elsewhere.bin", "wb") as f:
        assert not isinstance(f, InterceptedFile)
    with open(root / "x.pt", "wb") as f:
        f.write(b"ab")
    assert ("write", "$TMPDIR/tmpabc", 0, 5) in recorder.calls
    assert ("write", "x.pt", 0, 2) in recorder.calls


def test_a_staged_file_matches_only_a_glob_that_names_tmpdir(root):
    """A fault whose glob does not start with $TMPDIR/ (the default '*' included) never acts on a
    staged file: existing scenarios keep meaning what they meant."""
    everywhere = DiskFull(FaultSpec(kind="disk_full", trigger=trigger("write", 10, file="*"), params={}))
    staged = DiskFull(FaultSpec(kind="disk_full", trigger=trigger("write", 10, file="$TMPDIR/*"), params={}))
    assert everywhere.path_matches("step_8/x.pt") and not everywhere.path_matches("$TMPDIR/tmpabc")
    assert staged.path_matches("$TMPDIR/tmpabc") and not staged.path_matches("step_8/x.pt")


def test_disk_full_in_staging_only_while_the_checkpoint_directory_has_room(root, install, tmp_path):
    """ENOSPC in $TMPDIR (Lightning #20270 / #21253's situation) and none in the checkpoint directory."""
    staging = tmp_path / "rank-tmp"
    staging.mkdir()
    fault = arm(DiskFull(FaultSpec(kind="disk_full", trigger=trigger("write", 100, file="$TMPDIR/*"),
                                   params={"via": "quota"})), root, lambda *a, **k: None)
    install(root, [fault], staging=staging)
    with open(root / "x.pt", "wb") as f:
        f.write(b"x" * 1000)
    with pytest.raises(OSError) as info:
        with open(staging / "tmpabc", "wb") as f:
            f.write(b"y" * 1000)
    assert info.value.errno == errno.ENOSPC
    assert (root / "x.pt").stat().st_size == 1000
    assert (staging / "tmpabc").stat().st_size == 100


def test_disk_full_on_staging_counts_only_staged_files(root, install, tmp_path):
    """`on: staging`: ENOSPC in $TMPDIR, with `file` matched under it; the checkpoint directory keeps room."""
    staging = tmp_path / "rank-tmp"
    staging.mkdir()
    fault = arm(DiskFull(FaultSpec(kind="disk_full", trigger=trigger("write", 100, file="*"),
                                   params={"via": "quota", "on": "staging"})), root, lambda *a, **k: None)
    assert fault.path_matches("$TMPDIR/tmpabc") and not fault.path_matches("x.pt")
    install(root, [fault], staging=staging)
    with open(root / "x.pt", "wb") as f:
        f.write(b"x" * 1000)
    with pytest.raises(OSError) as info:
        with open(staging / "tmpabc", "wb") as f:
            f.write(b"y" * 1000)
    assert info.value.errno == errno.ENOSPC and (root / "x.pt").stat().st_size == 1000
