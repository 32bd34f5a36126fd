"""The pytest plugin end to end, in a separate pytest run (pytester): collection, bad files,
selection, xdist, JUnit XML, and that a run leaves no rank process or work directory behind."""
from __future__ import annotations

import json
import os
import textwrap

import pytest

# In-process pytester runs drop modules first imported inside them; torch cannot be imported twice
# in one process, so everything that imports it is imported here, before any inner run.
import resilience.strategies.torch.native
import resilience.workloads.mlp  # noqa: F401 -- imported for the reason above, not used

pytest_plugins = ["pytester"]

FAST_CASE = textwrap.dedent("""\
    name: fast no-fault case
    description: one rank, two steps, for plugin tests
    strategy: torch.rank0
    workload: {world_size: 1, steps: 2, checkpoint_every: 1, global_batch: 4}
    expect: recovers
    matrix:
      strategy: [torch.rank0, torch.per_rank]
    """)
BAD_CASE = textwrap.dedent("""\
    name: bad
    description: fault rank out of range
    strategy: torch.rank0
    workload: {world_size: 2, steps: 4, checkpoint_every: 2}
    fault: {kind: kill, rank: 5, step: 2, point: start}
    expect: recovers
    """)


@pytest.fixture(autouse=True)
def private_reference_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RESILIENCE_CACHE", str(tmp_path / "reference-cache"))


@pytest.fixture
def suite(pytester):
    pytester.makefile(".scenario.yaml", fast=FAST_CASE)
    pytester.makefile(".yaml", ds_config="train_batch_size: 8\nzero_optimization: {stage: 2}\n")
    return pytester


def test_only_scenario_files_are_collected(suite):
    result = suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["fast.scenario.yaml::strategy=torch.rank0",
                                 "fast.scenario.yaml::strategy=torch.per_rank", "*2 tests collected*"])
    assert "ds_config" not in result.stdout.str()


def test_markers_select_by_strategy_and_fault(suite):
    result = suite.runpytest("--collect-only", "-q", "-m", "strategy_torch_per_rank and fault_none")
    result.stdout.fnmatch_lines(["fast.scenario.yaml::strategy=torch.per_rank", "*1/2 tests collected*"])


def test_a_case_is_selected_by_its_values(suite):
    """A case id's ``key=value`` cannot be written in -k; its values are a marker's arguments."""
    suite.makefile(".scenario.yaml", stall=FAST_CASE.replace("expect: recovers", textwrap.dedent("""\
        fault: {kind: stall, rank: 0, step: 1, seconds: 3}
        expect: recovers""")).replace("strategy: [torch.rank0, torch.per_rank]", "fault.seconds: [3, 25]"))
    result = suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", "case(fault='stall', fault_seconds=25, tier='full')")
    result.stdout.fnmatch_lines(["stall.scenario.yaml::fault.seconds=25", "*1/4 tests collected (3 deselected)*"])
    quoted = suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-m", "case(fault_seconds='25')")
    quoted.stdout.fnmatch_lines(["no tests collected (4 deselected)*"])  # whole numbers are ints, as -m writes them


def test_an_equals_sign_in_k_is_refused_with_what_selects_by_value(suite):
    """pytest's -k has no '=': under xdist its refusal is an INTERNALERROR naming no cause; the
    plugin refuses first, in the controller, and says what to write instead."""
    result = suite.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "-k", "strategy=torch.rank0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*-k 'strategy=torch.rank0'*no '='*-m \"case(strategy='torch.rank0'*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_the_deep_tier_runs_only_where_m_names_it(suite):
    suite.makefile(".scenario.yaml", deep=FAST_CASE.replace("name: fast no-fault case", "name: deep\ntier: deep"))
    plain = suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    plain.stdout.fnmatch_lines(["*2/4 tests collected (2 deselected)*"])
    assert "deep.scenario.yaml" not in plain.stdout.str()
    deep = suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-m", "deep")
    deep.stdout.fnmatch_lines(["deep.scenario.yaml::strategy=torch.rank0", "*2/4 tests collected (2 deselected)*"])
    other = suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-m", "strategy_deepspeed or fault_none")
    other.stdout.fnmatch_lines(["*2/4 tests collected (2 deselected)*"])  # "deepspeed" does not name the tier
    assert "deep.scenario.yaml" not in other.stdout.str()


def test_bad_file_is_a_collection_error_and_the_rest_still_runs(suite, tmp_path):
    suite.makefile(".scenario.yaml", bad=BAD_CASE)
    work = tmp_path / "work"
    result = suite.runpytest("-p", "no:cacheprovider", f"--junitxml={tmp_path / 'out.xml'}",
                             f"--resilience-workdir={work}")
    output = result.stdout.str()
    assert "bad.scenario.yaml: fault.rank" in output and "got 5" in output and "allowed: 0..1" in output
    assert "Traceback" not in output
    result.assert_outcomes(passed=2, errors=1)
    assert result.ret == 1
    xml = (tmp_path / "out.xml").read_text()
    assert xml.count("<testcase") >= 2 and 'name="strategy=torch.rank0"' in xml
    assert not any(work.iterdir()), "case work directories must be removed"


def test_runs_under_xdist(suite):
    result = suite.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_a_run_records_each_case_duration_and_the_next_starts_the_longest_first(suite, tmp_path):
    durations = tmp_path / "reference-cache" / "durations.json"
    suite.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    recorded = json.loads(durations.read_text())  # written once, by xdist's controller
    ids = ["fast.scenario.yaml::strategy=torch.rank0", "fast.scenario.yaml::strategy=torch.per_rank"]
    assert sorted(recorded) == sorted(ids)
    # each case's ranks ran in processes forked by the worker's fork server: their CPU is counted
    assert all(cost["seconds"] > 0 and cost["cpu_seconds"] > 0 for cost in recorded.values()), recorded
    durations.write_text(json.dumps({ids[0]: 1.0, ids[1]: 9.0}))
    suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider").stdout.fnmatch_lines([ids[1], ids[0]])
    durations.write_text(json.dumps({ids[1]: 9.0}))  # a case never seen goes first
    suite.runpytest("--collect-only", "-q", "-p", "no:cacheprovider").stdout.fnmatch_lines([ids[0], ids[1]])


def test_failed_case_reports_verdict_and_replay(pytester):
    pytester.makefile(".scenario.yaml", wrong=FAST_CASE.replace("expect: recovers", "expect: fails_loudly")
                      .replace("matrix:\n  strategy: [torch.rank0, torch.per_rank]\n", ""))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*verdict: RECOVERED   expected: LOUD*", "*replay: python -m resilience run*"])


@pytest.mark.fresh_reference  # its reference's rank processes are among those checked
def test_no_rank_process_survives_a_case(tmp_path):
    from .harness_helpers import run_case

    result = run_case(tmp_path, keep=True, workload={"world_size": 2, "steps": 4, "checkpoint_every": 2},
                      fault={"kind": "kill", "rank": 1, "step": 4, "point": "write", "file": "*_rank_1.pt",
                             "after_bytes": 100})
    pids = {e["pid"] for phase in result.phases for r in phase.ranks for e in r.events if "pid" in e}
    assert len(pids) >= 6  # 2 ranks x (reference, first run, restart)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"rank process {pid} outlived its case"


def test_a_skip_fails_only_in_ci(pytester, monkeypatch):
    pytester.makefile(".scenario.yaml", tmpfs=textwrap.dedent("""\
        name: needs root
        description: skipped where tmpfs cannot be mounted
        strategy: torch.rank0
        workload: {world_size: 1, steps: 2, checkpoint_every: 1, global_batch: 4}
        fault: {kind: disk_full, via: tmpfs, rank: 0, step: 2, point: start}
        expect: fails_loudly
        """))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # as a user without root, in this process
    monkeypatch.delenv("CI", raising=False)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(skipped=1)
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*skipped in CI (CI=true)*needs root*"])
