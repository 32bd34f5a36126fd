"""torchrun's agent forked warm (resilience/launch/warm_agent.py): a launch behaves as
``python -m torch.distributed.run`` started fresh would, and ends as one does."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resilience.core.janitor import kill_group, signal_process
from resilience.core.processes import is_running
from resilience.core.waiting import wait_until
from resilience.launch.warm_agent import MAX_SERVERS, in_a_node_namespace, live_agents, start_launcher
from resilience.run.agent_launch import descends_from

from .procs import child_pids, pids_naming

pytestmark = pytest.mark.slow

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
SCRIPT = """\
import os, sys
line = " ".join(["rank", os.environ["RANK"], "sees", str(os.environ.get("ONLY_IN_LAUNCH")),
                 str(os.environ.get("ONLY_IN_HARNESS")), "cwd", os.getcwd(), "stdin", repr(sys.stdin.read())])
os.write(1, (line + "\\n").encode())  # one write: both ranks append to one log
if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
    raise SystemExit(3)
if os.environ.get("SLEEP"):
    import time
    time.sleep(600)
"""


def launch(tmp_path: Path, **extra: str):
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    log = tmp_path / "agent.log"
    env = {name: value for name, value in os.environ.items() if name != "ONLY_IN_HARNESS"}
    (tmp_path / "tmp").mkdir()
    env.update(ONLY_IN_LAUNCH="yes", TMPDIR=str(tmp_path / "tmp"), **extra)  # torchrun's log directory goes there
    work = tmp_path / "work"
    work.mkdir()
    previous = os.getcwd()
    os.chdir(work)  # the agent runs where the launch was made
    try:
        launcher = start_launcher([*TORCHRUN, str(script)], env, log)
    finally:
        os.chdir(previous)
    return launcher, log, work


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def harness_only_variable(monkeypatch):
    monkeypatch.setenv("ONLY_IN_HARNESS", "leaked")


def test_a_warm_agent_runs_the_script_with_the_launch_s_environment_directory_and_output(
        tmp_path, harness_only_variable):
    launcher, log, work = launch(tmp_path)
    assert parent_of(launcher.pid) != os.getpid()  # forked by the server, not started by us
    assert launcher.wait(timeout=120) == 0, log.read_text()
    lines = sorted(line for line in log.read_text().splitlines() if line.startswith("rank "))
    assert lines == [f"rank {rank} sees yes None cwd {work} stdin ''" for rank in (0, 1)]
    assert list((tmp_path / "tmp").glob("torchelastic_*"))  # the launch's TMPDIR, not the server's


def test_a_failing_rank_ends_the_warm_agent_as_torchrun_ends(tmp_path):
    launcher, log, _ = launch(tmp_path, FAIL_RANK="1")
    assert launcher.wait(timeout=120) == 1
    assert "ChildFailedError" in log.read_text()  # torchrun's own report, as a fresh agent prints it


def test_a_killed_warm_agent_is_reaped_and_its_ranks_are_found_below_it(tmp_path):
    launcher, log, _ = launch(tmp_path, SLEEP="1")
    script = tmp_path / "train.py"
    deadline = time.monotonic() + 120
    while len(pids_naming(script)) < 2:  # both ranks run the script
        assert time.monotonic() < deadline and launcher.poll() is None, log.read_text()
        time.sleep(0.1)
    ranks = pids_naming(script)
    try:
        assert all(descends_from(pid, launcher.pid) for pid in ranks)  # how AgentLaunch finds its own
        assert os.getpgid(launcher.pid) == launcher.pid  # a session of its own, as start_new_session gives
        kill_group(launcher.pid)
        launcher.kill()
        assert launcher.wait(timeout=30) == -9
        assert not Path(f"/proc/{launcher.pid}").exists()  # the server reaped it
    finally:
        for pid in ranks:  # torchrun's ranks lead sessions of their own: AgentLaunch.destroy ends them so
            with contextlib.suppress(ProcessLookupError):
                kill_group(os.getpgid(pid))
    deadline = time.monotonic() + 30
    while pids_naming(script) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_naming(script) == []


HARNESS_KILLED_AT_ONCE = """\
import os, signal, sys
from resilience.core import janitor
from resilience.launch.warm_agent import start_launcher
launcher = start_launcher(sys.argv[2:-1], dict(os.environ), sys.argv[-1])
os.kill(launcher.pid, signal.SIGSTOP)  # held in its start: most likely before its setsid
janitor.register("pgid", launcher.pid)  # as AgentLaunch does
with open(sys.argv[1], "w") as out:
    out.write(str(launcher.pid))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_harness_killed_as_its_agent_starts_leaves_no_agent_behind(tmp_path):
    """A harness SIGKILLed right after the server forked its agent: the janitor's group kill may
    come before the agent's session (and group) exists and miss it. The agent, once its session
    begins, sees the harness gone and ends before torchrun starts any rank. The harness stops the
    agent as it starts, and the agent goes on once the janitor has had its moment."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    pid_file, log = tmp_path / "agent.pid", tmp_path / "harness.log"
    with open(log, "wb") as output:  # not a pipe: the server and the agent would hold it open
        harness = subprocess.run([sys.executable, "-c", HARNESS_KILLED_AT_ONCE, str(pid_file), *TORCHRUN,
                                  str(script), str(tmp_path / "agent.log")], stdin=subprocess.DEVNULL,
                                 stdout=output, stderr=output, timeout=120, env=dict(os.environ, SLEEP="1"))
    assert harness.returncode == -9, log.read_text()
    agent = int(pid_file.read_text())
    try:
        time.sleep(1)  # the janitor's group kill, which a stopped agent past its setsid would not survive
        signal_process(agent, signal.SIGCONT)
        assert wait_until(lambda: not is_running(agent), 30, interval_s=0.1), \
            "the warm agent outlived the harness that asked for it"
        assert pids_naming(script) == []
    finally:
        for pid in [agent, *pids_naming(script)]:
            with contextlib.suppress(ProcessLookupError):
                kill_group(os.getpgid(pid))


def test_another_launcher_starts_as_a_fresh_process(tmp_path):
    log = tmp_path / "other.log"
    launcher = start_launcher(["sh", "-c", "echo $ONLY_IN_LAUNCH"], {"ONLY_IN_LAUNCH": "yes", "PATH": os.defpath}, log)
    assert isinstance(launcher, subprocess.Popen)
    assert launcher.wait(timeout=30) == 0
    assert log.read_text() == "yes\n"


def test_servers_beyond_the_limit_end_once_idle(tmp_path, monkeypatch):
    """Each distinct start-up environment gets a server; the oldest idle one ends to make room."""
    def our_agent_servers() -> list[int]:
        return [pid for pid in child_pids(os.getpid())
                if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()]

    counts = []
    for index in range(MAX_SERVERS + 1):
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / f"layer{index}"))  # a new import path, a new server
        launcher, log, _ = launch(tmp_path / f"launch{index}")
        assert launcher.wait(timeout=120) == 0, log.read_text()
        counts.append(len(our_agent_servers()))
    assert max(counts) == MAX_SERVERS and counts[-1] == MAX_SERVERS, counts
    assert live_agents() == []


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2's ip")
def test_a_node_s_driver_in_its_network_namespace_launches_fresh():
    """A node loss kills a driver and its janitor at once: no server of theirs may outlive them."""
    probe = "from resilience.launch.warm_agent import in_a_node_namespace as f; print(f())"
    assert not in_a_node_namespace()
    name = f"resilience-{os.getpid()}-warm-agent-test"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        inside = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-c", probe], capture_output=True,
                                text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True, timeout=30)
    assert inside.stdout.strip() == "True", inside.stderr
