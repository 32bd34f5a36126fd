"""Hygiene under abuse: a `pytest` run of scenarios interrupted by Ctrl-C or by SIGTERM (and a
`resilience run` by SIGTERM), or a pytest-xdist worker SIGKILLed mid case, leaves no rank process,
mount, network namespace or temporary directory behind.

Each test runs pytest on a small scenario in a session of its own, with TMPDIR and RESILIENCE_CACHE
in a fresh directory and a marker variable in its environment (every process of the run inherits
it), interrupts it mid case, and then looks for what is left.
"""
from __future__ import annotations

import getpass
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.procs import child_pids

REPO = Path(__file__).resolve().parents[1]
MARKER = "RESILIENCE_HYGIENE_MARK"
MID_CASE_DEADLINE_S = 420  # pytest start, the forkserver's warm-up and the reference: 180 s was passed at load 14
# Interrupted, the harness kills the ranks at once (0.2-0.6 s at load 13); pytest's own exit is
# CPU-bound (the traceback formatted from source, Hypothesis's summary plugin importing it, a last
# gc): 2 s idle, 15-25 s at load 13, once past 60 s beside the full suite.
RANKS_GONE_DEADLINE_S = 60  # for the case's ranks to die once interrupted
EXIT_DEADLINE_S = 300  # for pytest to end once interrupted
FAULT_S = 900  # the stall and the cut outlast both deadlines: a run that ignored the interrupt fails
CLEAN_DEADLINE_S = 20  # for the janitor to free what the run left

# A rank stopped (SIGSTOP) in its peer's barrier for 15 minutes: the case is surely mid-way when
# the fault has fired.
STALL = f"""\
    name: stalled rank
    description: rank 1 stopped for 15 minutes in the step-4 save
    strategy: torch.per_rank
    workload: {{model: mlp, world_size: 2, steps: 8, checkpoint_every: 4, seed: 0}}
    fault: {{kind: stall, rank: 1, step: 4, phase: save, seconds: {FAULT_S}}}
    timeouts: {{collective: {FAULT_S + 60}, phase: {FAULT_S + 120}}}
    expect: recovers
    """
# The checkpoint directory is a tmpfs from setup on; enough steps to interrupt the first run.
TMPFS = """\
    name: long run on a tmpfs
    description: the checkpoint directory is a mounted tmpfs while the first run trains
    strategy: torch.per_rank
    workload: {model: mlp, world_size: 2, steps: 1600, checkpoint_every: 800, seed: 0}
    fault: {kind: disk_full, via: tmpfs, rank: 0, step: 800, point: start, after_bytes: 8192}
    expect: fails_loudly
    """
# Ranks in network namespaces, rank 1's link cut for 15 minutes.
PARTITION = f"""\
    name: long partition
    description: rank 1's link cut for 15 minutes in the step-4 save
    strategy: torch.per_rank
    workload: {{model: mlp, world_size: 2, steps: 8, checkpoint_every: 4, seed: 0}}
    fault: {{kind: partition, rank: 1, step: 4, phase: save, seconds: {FAULT_S}}}
    timeouts: {{collective: {FAULT_S + 60}, phase: {FAULT_S + 120}}}
    expect: recovers
    """
CASES = {"stall": STALL, "tmpfs": TMPFS, "partition": PARTITION}

# A terminal's job gets Ctrl-C; a process started in the background by a non-interactive shell
# (`cmd &`, as a CI runner may start this suite) inherits SIGINT ignored, Python then keeps it
# ignored, and the interrupt under test would never arrive. The inner run starts as a terminal's
# job does: SIGINT at its default, which survives the exec (Python then installs KeyboardInterrupt).
AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def _needs(kind: str) -> None:
    """tmpfs and partition cases need root (and the network tools); elsewhere skipped (with
    CI=true a skip fails the run, see tests/conftest.py)."""
    if kind == "stall":
        return
    if os.geteuid() != 0:
        pytest.skip(f"the {kind} variant mounts or builds network namespaces, which needs root")
    if kind == "partition" and not (shutil.which("ip") and shutil.which("nft")):
        pytest.skip("the partition variant needs iproute2 and nftables")


def _ranks_training(first_runs: list[Path], world_size: int = 2) -> bool:
    """Every rank of the first run has started and logged some events: past its start-up, when the
    harness has registered it with the janitor (a kill inside the instant between the fork and that
    registration is the one window the janitor cannot cover; README)."""
    logs = [p for d in first_runs for p in d.glob("rank*.events.jsonl")]
    return len(logs) == world_size and all(len(p.read_text().splitlines()) >= 3 for p in logs)


class Run:
    """One marked run of one scenario, by pytest or by ``python -m resilience run`` (``command``),
    in its own session (its process group id is its pid)."""

    def __init__(self, root: Path, scenario: str, extra: list[str], command: str = "pytest"):
        self.root, self.tmp, self.token = root, root / "tmp", secrets.token_hex(8)
        self.created_namespaces: list[str] = []  # seen mid case
        self.tmp.mkdir()
        scenario_file = root / "case.scenario.yaml"
        scenario_file.write_text(textwrap.dedent(scenario))
        env = dict(os.environ, TMPDIR=str(self.tmp), RESILIENCE_CACHE=str(root / "cache"),
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **{MARKER: self.token})
        env.pop("CI", None)  # the inner run's verdicts do not matter here
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # set for this run: the inner run places its own
        self.log = open(root / "pytest.log", "wb")  # closed in stop
        pytest_arguments = ["-p", "no:cacheprovider", "-q", f"--basetemp={root / 'basetemp'}"]
        arguments = (["-m", "pytest", str(scenario_file), *pytest_arguments] if command == "pytest"
                     else ["-m", "resilience", "run", str(scenario_file)])
        self.process = subprocess.Popen(
            [sys.executable, "-c", AS_FROM_A_TERMINAL, *arguments, *extra],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def marked_processes(self) -> dict[int, str]:
        """Live (not zombie) processes carrying this run's marker: pid -> command line."""
        found = {}
        needle = f"{MARKER}={self.token}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if needle not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    continue
                command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
            except OSError:
                continue
            if _running(int(entry)):
                found[int(entry)] = command.decode(errors="replace")
        return found

    def mounts(self) -> list[str]:
        return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if line.split()[4].startswith(str(self.root))]

    def namespaces(self) -> list[str]:
        """Network namespaces named after one of this run's processes (see faults/network/partition.py)."""
        pids = self.marked_processes()
        names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
        return [name for name in names if any(name.startswith(f"resilience-{pid}-") for pid in pids)]

    def leftover_files(self) -> list[str]:
        """What the run left in TMPDIR (torch's compile cache too: the forkserver keeps it in its own
        multiprocessing directory, see `resilience.rank.zygote`)."""
        return sorted(p.name for p in self.tmp.iterdir())

    def wait_mid_case(self, kind: str) -> None:
        """Until the first run is under way with its resources in place (the fault fired, or the
        tmpfs is mounted)."""
        deadline = time.monotonic() + MID_CASE_DEADLINE_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"pytest ended before the case was mid-way:\n{self.output()}"
            first_runs = list(self.tmp.glob("resilience-*/first_run"))
            if kind == "tmpfs" and self.mounts() and _ranks_training(first_runs):
                return
            if kind != "tmpfs" and any("fault_fired" in p.read_text() for d in first_runs
                                       for p in d.glob("rank*.events.jsonl")):
                return
            time.sleep(0.1)
        raise AssertionError(f"the case did not reach its first run within {MID_CASE_DEADLINE_S} s:\n{self.output()}")

    def busy_worker(self) -> int:
        """The xdist worker running the case: the child of pytest that started processes of its own."""
        workers = [pid for pid in child_pids(self.process.pid) if child_pids(pid)]
        assert len(workers) == 1, f"expected one busy xdist worker among {child_pids(self.process.pid)}"
        return workers[0]

    def rank_pids(self) -> list[int]:
        """The first run's rank processes, from the first event each wrote."""
        return [json.loads(path.read_text().splitlines()[0])["pid"]
                for path in self.tmp.glob("resilience-*/first_run/rank*.events.jsonl")]

    def wait_exit(self, ranks: list[int]) -> None:
        deadline = time.monotonic() + RANKS_GONE_DEADLINE_S
        while any(_running(pid) for pid in ranks):
            if time.monotonic() > deadline:
                self.fail_with_stacks(f"ranks {[p for p in ranks if _running(p)]} still running "
                                      f"{RANKS_GONE_DEADLINE_S} s after the interrupt")
            time.sleep(0.05)
        try:
            self.process.wait(timeout=EXIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.fail_with_stacks(f"pytest still running {EXIT_DEADLINE_S} s after the interrupt")

    def fail_with_stacks(self, what: str) -> None:
        """Fail showing where the run waits: the state of each of its processes, and every thread's
        stack in pytest (its faulthandler prints them on SIGABRT)."""
        left = sorted(self.marked_processes().items())
        states = {pid: _state(pid) for pid, _ in left}
        os.kill(self.process.pid, signal.SIGABRT)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        raise AssertionError(f"{what}; its processes (pid: state, command): "
                             f"{[(pid, states[pid], cmd) for pid, cmd in left]}\n{self.output()}")

    def leftovers(self) -> dict[str, list]:
        """What is still there once the janitor had its time (empty lists: nothing)."""
        deadline = time.monotonic() + CLEAN_DEADLINE_S
        while True:
            found = {"processes": sorted(self.marked_processes().items()), "files": self.leftover_files(),
                     "mounts": self.mounts(), "namespaces": sorted(set(self.created_namespaces) & set(_netns()))}
            if not any(found.values()) or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def output(self) -> str:
        self.log.flush()
        return (self.root / "pytest.log").read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        """Whatever happened: end this run's own process groups (pytest's, and each leftover rank's,
        which leads its own) and free what it left, so a failing test leaks nothing either."""
        for pgid in {self.process.pid} | {pid for pid in self.marked_processes() if _pgid(pid) == pid}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait()
        self.log.close()
        for mount in sorted(self.mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True, timeout=30)
        for name in set(self.created_namespaces) & set(_netns()):
            subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True, timeout=30)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _state(pid: int) -> str:
    """The process's state letter (R, S, D, T, Z, ...), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit status waits for init to collect it)."""
    return _state(pid) not in ("Z", "gone")


def _netns() -> list[str]:
    return os.listdir("/run/netns") if os.path.isdir("/run/netns") else []


@pytest.fixture
def scenario_run(tmp_path):
    runs = []

    def start(kind: str, extra: list[str], command: str = "pytest") -> Run:
        run = Run(tmp_path, CASES[kind], extra, command)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()


def _interrupt_mid_case(run: Run, kind: str, interrupt) -> None:
    run.wait_mid_case(kind)
    run.created_namespaces = run.namespaces()
    assert kind != "partition" or run.created_namespaces, "the case's network namespaces were not seen"
    assert kind != "tmpfs" or run.mounts(), "the case's tmpfs was not mounted at the interrupt"
    assert run.marked_processes(), "no process of the run was seen"
    ranks = run.rank_pids()
    interrupt()
    run.wait_exit(ranks)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_ctrl_c_mid_case_leaves_nothing_behind(scenario_run, kind):
    _needs(kind)
    run = scenario_run(kind, [])
    # a terminal's Ctrl-C: SIGINT to the foreground process group (pytest and what shares its group)
    _interrupt_mid_case(run, kind, lambda: os.killpg(run.process.pid, signal.SIGINT))
    assert run.leftovers() == {"processes": [], "files": [], "mounts": [], "namespaces": []}, run.output()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_sigterm_mid_case_leaves_nothing_behind(scenario_run, kind):
    """What a CI time limit or `timeout` sends, to pytest alone: torn down as Ctrl-C tears it down."""
    _needs(kind)
    run = scenario_run(kind, [])
    _interrupt_mid_case(run, kind, lambda: os.kill(run.process.pid, signal.SIGTERM))
    # pytest unwound as from Ctrl-C (its "interrupted" status), not killed by the signal: the
    # janitor alone would leave nothing behind either
    assert run.process.returncode == pytest.ExitCode.INTERRUPTED, run.output()
    assert run.leftovers() == {"processes": [], "files": [], "mounts": [], "namespaces": []}, run.output()


@pytest.mark.slow
def test_sigterm_ends_a_resilience_run_with_one_line_and_leaves_nothing_behind(scenario_run):
    run = scenario_run("stall", [], command="run")
    _interrupt_mid_case(run, "stall", lambda: os.kill(run.process.pid, signal.SIGTERM))
    assert run.process.returncode == 128 + signal.SIGTERM, run.output()
    assert run.output().strip().splitlines()[-1].startswith("resilience: terminated (SIGTERM)"), run.output()
    assert "Traceback" not in run.output(), run.output()
    assert run.leftovers() == {"processes": [], "files": [], "mounts": [], "namespaces": []}, run.output()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_killed_xdist_worker_mid_case_leaves_nothing_behind(scenario_run, kind):
    pytest.importorskip("xdist")
    _needs(kind)
    run = scenario_run(kind, ["-n", "2"])
    _interrupt_mid_case(run, kind, lambda: os.kill(run.busy_worker(), signal.SIGKILL))
    assert "crashed" in run.output()
    assert run.leftovers() == {"processes": [], "files": [], "mounts": [], "namespaces": []}, run.output()


REGISTER_THEN_DIE = """\
import os, signal, subprocess, sys
from resilience.core import janitor
doomed, kept = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(doomed, "inner"))
os.makedirs(kept)
sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
janitor.register("pgid", sleeper.pid)
janitor.register("dir", doomed)
janitor.register("dir", kept)
janitor.release("dir", kept)
print(sleeper.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_janitor_frees_what_a_killed_process_registered_and_not_what_it_released(tmp_path):
    doomed, kept = tmp_path / "doomed", tmp_path / "kept"
    result = subprocess.run([sys.executable, "-c", REGISTER_THEN_DIE, str(doomed), str(kept)], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == -signal.SIGKILL, result.stderr
    sleeper = int(result.stdout)
    try:
        deadline = time.monotonic() + CLEAN_DEADLINE_S
        while (_running(sleeper) or doomed.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(sleeper), "the registered process group is still alive"
        assert not doomed.exists() and kept.is_dir()
    finally:
        try:
            os.killpg(sleeper, signal.SIGKILL)  # our own grandchild's group, only if the janitor failed
        except ProcessLookupError:
            pass


COMPILE_CACHE_RUN = """\
import os, subprocess, sys
from resilience.core import compile_cache
compile_cache.keep_in_this_run()
compile_cache.keep_in_this_run()  # a second call changes nothing
print(os.environ["TORCHINDUCTOR_CACHE_DIR"], flush=True)
# a process the run starts (a rank, an agent, a script) loads torch._dynamo, as DeepSpeed's import does
subprocess.run([sys.executable, "-c", "import torch._dynamo"], check=True, timeout=120)
print(sorted(os.listdir(os.environ["TMPDIR"])), flush=True)
"""


def test_torchs_compile_cache_lives_and_goes_with_the_run(tmp_path):
    """torch 2.13.0 makes $TMPDIR/torchinductor_<user> when torch._dynamo loads and never removes it;
    the run's processes put it in a directory of the run, gone when the run exits."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(TMPDIR=str(tmp), PYTHONPATH=str(REPO))
    plain = subprocess.run([sys.executable, "-c", "import torch._dynamo"], env=env, capture_output=True, text=True,
                           timeout=120, check=True)
    assert [path.name for path in tmp.iterdir()] == [f"torchinductor_{getpass.getuser()}"], plain
    shutil.rmtree(tmp / f"torchinductor_{getpass.getuser()}")
    done = subprocess.run([sys.executable, "-c", COMPILE_CACHE_RUN], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180, check=True)
    cache, listed = done.stdout.splitlines()
    assert Path(cache).parent == tmp and Path(cache).name.startswith("resilience-compile-cache-")
    assert listed == repr([Path(cache).name])  # the child used the run's directory, made nothing beside it
    assert list(tmp.iterdir()) == []  # and the run's exit removed it
