"""The fork backend (ranks forked from a server with torch preloaded) gives the same verdicts as the
spawn backend (here for two cases; the whole smoke tier in `tests/test_repeat.py`, whose rounds
alternate the backends), forks only from a single-threaded server, and leaves no rank behind; the
reference cache runs a reference once and keys it on what defines it."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from resilience.core.case import Software, VerdictKind
from resilience.core.processes import process_state, tree_cpu_seconds
from resilience.core.waiting import wait_until
from resilience.launch.backend import BACKENDS, ForkServerBackend, backend_for_software
from resilience.launch.fork_server import ServerProcess, new_server, stop_server
from resilience.rank.orphan_reaper import imported_by_fork_server
from resilience.run.harness import Harness
from resilience.run.reference_cache import ReferenceCache, reference_key
from resilience.strategies.dlrover import PACKAGES as DLROVER
from resilience.strategies.gemini import PACKAGES as GEMINI
from resilience.strategies.torchtitan import PACKAGES as TORCHTITAN

from .harness_helpers import case_from, layered_or_skip

TORN = {"kind": "kill", "rank": 1, "step": 8, "point": "write", "file": "*_rank_1.pt", "after_bytes": 4096}
IN_TRAINING = {"kind": "kill", "rank": 0, "step": 6, "phase": "train"}


def test_zygote_server_is_single_threaded_after_preload():
    code = "import resilience.rank.zygote as z; print(z.THREADS_AFTER_PRELOAD)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "1"


def test_a_forked_rank_collects_only_what_it_created_itself():
    """The server freezes what its preload created: a rank's garbage collection (a library's own
    ``gc.collect()``, say) walks the objects the rank made, not the hundreds of thousands it
    inherited, and writes nothing into the server's shared pages."""
    code = ("import gc, os, resilience.rank.zygote; frozen = gc.get_freeze_count(); pid = os.fork()\n"
            "if pid == 0:\n"
            "    made = [[index] for index in range(1000)]; gc.collect()\n"
            "    print(frozen, gc.get_freeze_count(), len(gc.get_objects()), flush=True); os._exit(0)\n"
            "os.waitpid(pid, 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    frozen, inherited_frozen, collected = map(int, out.stdout.split())
    assert frozen > 100_000 and inherited_frozen > frozen * 0.9, out.stdout  # a few freed by their refcount
    assert 1000 < collected < frozen // 10, out.stdout  # the rank's own lists, and little else


def test_a_rank_s_orphan_is_reaped_by_the_server_and_its_cpu_counted(tmp_path):
    """A process a rank started that outlives it (megatron-core's async writer leaves a Manager per
    rank) is re-parented to the server, not to init: the server reaps it, so its CPU stays in the
    harness's count of the case and no zombie is left. The harness itself does not become a reaper."""
    pid_file = tmp_path / "orphan.pid"
    spin = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "while time.process_time() < 1.0: pass")  # one CPU second, however busy the machine
    server = new_server(["resilience.rank.orphan_reaper"])
    rank = ServerProcess(target=subprocess.Popen, args=([sys.executable, "-c", spin],), server=server)
    rank.start()  # it starts the spinning process and exits at once
    try:
        rank.join(timeout=60)
        assert rank.exitcode == 0
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60, interval_s=0.01)
        orphan = int(pid_file.read_text())
        parents = set()

        def reaped() -> bool:  # noting each parent seen; gone from /proc only once reaped
            state = process_state(orphan)
            if state is not None:
                parents.add(state[1])
            return state is None

        assert wait_until(reaped, 60, interval_s=0.01), "the orphan was never reaped"
        assert len(parents) == 1, parents
        server_pid = parents.pop()  # a child of this process: the server this test started
        assert server_pid != rank.pid and process_state(server_pid)[1] == os.getpid()
        # the server's own CPU (starting up, forking the rank) is a small part of this second
        assert tree_cpu_seconds(server_pid) >= 0.99  # the orphan's second, in the server's reaped children
        assert not imported_by_fork_server()
    finally:
        stop_server(server)


@pytest.mark.parametrize("packages, library", [(DLROVER, "DLRover"), (GEMINI, "lm-resiliency"),
                                               (TORCHTITAN, "torchtitan"), (("deepspeed==0.17.6",), "DeepSpeed")])
def test_a_layered_server_preloads_the_layered_release_and_stays_single_threaded(packages, library):
    """A server for ranks under layered packages imports what a forked rank of it would (the layers
    first on its path, as `launch.forked` starts it) and is still single-threaded after it."""
    layered_or_skip(packages, library)
    software = Software(packages=packages)
    backend = backend_for_software(software, "tests/generated.scenario.yaml", "software")
    assert isinstance(backend, ForkServerBackend) and backend.layers
    code = ("import importlib.metadata as m, resilience.rank.zygote as z, deepspeed; "
            "print(z.THREADS_AFTER_PRELOAD, deepspeed.__version__ == m.version('deepspeed'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True,
                         env=dict(os.environ, PYTHONPATH=backend.python_path))
    assert out.stdout.split()[-2:] == ["1", "True"], out.stdout + out.stderr


@pytest.mark.parametrize("fault, expected", [(TORN, VerdictKind.LOUD), (IN_TRAINING, VerdictKind.RECOVERED)])
def test_both_backends_give_the_same_verdict(tmp_path, fault, expected):
    case = case_from(fault=fault)
    verdicts = {}
    for name in ("spawn", "fork"):
        result = Harness(backend=BACKENDS[name](), work_root=tmp_path).run(case)
        verdicts[name] = (result.verdict.kind, result.verdict.restored_step, result.verdict.complete_step)
    assert verdicts["spawn"] == verdicts["fork"]
    assert verdicts["fork"][0] is expected


def test_forked_ranks_do_not_outlive_their_case(tmp_path):
    result = Harness(backend=BACKENDS["fork"](), work_root=tmp_path, keep=True).run(case_from(fault=TORN))
    pids = {e["pid"] for phase in result.phases for r in phase.ranks for e in r.events}
    assert len(pids) >= 6
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"rank {pid} outlived its case"


def test_reference_is_computed_once_and_shared(tmp_path):
    cache = ReferenceCache(tmp_path / "cache")
    harness = Harness(backend=BACKENDS["fork"](), work_root=tmp_path / "work", keep=True, cache=cache)
    first = harness.run(case_from(fault=IN_TRAINING))
    second = harness.run(case_from(fault=TORN))
    assert len(list((tmp_path / "cache").glob("*/complete"))) == 1
    assert not (second.work_dir / "reference").exists()  # read from the cache, not run again
    assert first.phases[0].losses(0) == second.phases[0].losses(0)
    assert second.verdict.kind is VerdictKind.LOUD and first.verdict.kind is VerdictKind.RECOVERED


def test_reference_key_changes_with_what_defines_the_run():
    case = case_from()
    key = reference_key(case, False)
    assert key == reference_key(case_from(fault=TORN, expect="fails_loudly"), False)  # faults do not matter
    assert key != reference_key(case, True)
    assert key != reference_key(replace(case, workload=replace(case.workload, seed=1)), False)
    assert key != reference_key(replace(case, workload=replace(case.workload, world_size=4, global_batch=16)), False)


def test_topology_change_uses_cached_snapshots(tmp_path):
    cache = ReferenceCache(tmp_path / "cache")
    harness = Harness(backend=BACKENDS["fork"](), work_root=tmp_path / "work", cache=cache)
    case = case_from(strategy="torch.rank0", workload={"world_size": 2}, restart={"world_size": 4},
                     fault=IN_TRAINING)
    for _ in range(2):
        result = harness.run(case)
        assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
        assert [p.name for p in result.phases][-1] == "continuation"


# the only places the code a rank runs may import the scenario package: validators, which run in
# the controller as a scenario is loaded (a rank receives the validated case: `Case.read`)
SCENARIO_IMPORTS_IN_RANK_CODE = {("strategies/declarations.py", "option_problem"),
                                 ("strategies/manifest.py", "check_options")}


def test_rank_code_imports_the_scenario_package_only_in_validators_and_the_key_leaves_it_out():
    import ast

    from resilience.run.reference_cache import RANK_CODE, rank_sources

    package = Path(__file__).resolve().parent.parent / "resilience"
    found = set()
    for path in rank_sources():
        tree = ast.parse(path.read_text())
        for function in [None, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            body = tree.body if function is None else function.body
            for node in body:
                if isinstance(node, ast.ImportFrom) and "scenario" in (node.module or "").split(".")[:2]:
                    found.add((str(path.relative_to(package)), function.name if function else "<module>"))
    assert found == SCENARIO_IMPORTS_IN_RANK_CODE
    assert "scenario" not in RANK_CODE and not any("/scenario/" in str(p) for p in rank_sources())


def test_a_case_reaches_its_ranks_as_the_records_the_controller_validated(tmp_path):
    from resilience.core.case import Case
    from resilience.scenario.discovery import load_all_cases

    cases, errors = load_all_cases([Path(__file__).resolve().parent.parent / "scenarios"])
    assert not errors
    for case in (c for c in cases if isinstance(c, Case)):
        case.write(tmp_path / "case.json")
        assert Case.read(tmp_path / "case.json") == case, case.id
