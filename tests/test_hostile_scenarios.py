"""Hostile scenario files: a scenario is data. Whatever a file holds, the loader either loads it or
raises `ScenarioError` naming the file, and nothing a scenario names makes the harness write or
delete outside the case's work directory and the checkpoint directory. Naming an importable
strategy, workload or interpreter runs that code, by design (like a conftest), and is not tested
here as an escape.
"""
from __future__ import annotations

import copy
import math
import os
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resilience.core import registry
from resilience.core.case import Scenario
from resilience.core.confined import relative_glob_problem, resolve_under
from resilience.errors import PathEscape, ScenarioError
from resilience.scenario import loader
from resilience.scenario.loader import load_file, load_text

from .harness_helpers import run_case

SOURCE = "hostile.scenario.yaml"
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much])


def scenario_error(text: str, source: str = SOURCE) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_text(text, source)
    assert str(info.value).startswith(f"{source}: "), str(info.value)
    return info.value


def valid(fault: str = "{kind: kill, rank: 0, step: 8, point: start}", extra: str = "") -> str:
    return ("name: hostile\ndescription: d\nstrategy: torch.per_rank\n"
            "workload: {world_size: 2, steps: 12, checkpoint_every: 4}\n"
            f"fault: {fault}\nexpect: recovers\n{extra}")


# -- every glob a scenario gives stays under the checkpoint directory ----------------------------
ESCAPES = ["../x.pt", "../../etc/passwd", "step_*/../../x", "..", "/etc/passwd", "/", "~/x.pt", "~root/.ssh/*",
           "a\0b"]
GLOB_KEYS = [
    ("fault.file", "{kind: bit_flip, rank: 0, step: 8, file: GLOB}"),
    ("fault.source", "{kind: duplicate_file, rank: 0, step: 8, file: '*_rank_1.pt', source: GLOB}"),
    ("fault.source", "{kind: straggler, rank: 0, step: 8, file: '*_rank_1.pt', source: GLOB}"),
    ("fault.once_written", "{kind: kill, rank: 0, step: 8, point: close, file: '*.pt', once_written: GLOB}"),
]


@pytest.mark.parametrize("key,fault", GLOB_KEYS, ids=[f"{k}({f.split(',')[0][7:]})" for k, f in GLOB_KEYS])
@pytest.mark.parametrize("pattern", ESCAPES, ids=[repr(p) for p in ESCAPES])
def test_a_glob_that_leaves_the_checkpoint_directory_is_refused_naming_the_key(key, fault, pattern):
    err = scenario_error(valid(fault.replace("GLOB", yaml.safe_dump(pattern, default_style='"').strip())))
    assert err.key == key and err.value == pattern, str(err)
    assert f": {key}: must stay inside the checkpoint directory" in str(err)
    assert "relative to the checkpoint directory" in err.allowed


def test_globs_inside_the_checkpoint_directory_still_load():
    for pattern in ["*", "step_*/ckpt_rank_1.pt", "global_step*/..pt", "a..b/*", "./latest"]:
        case = load_text(valid(f"{{kind: bit_flip, rank: 0, step: 8, file: '{pattern}'}}"), SOURCE).cases[0]
        assert case.fault.trigger.file == pattern


def test_a_restart_interpreter_with_a_nul_byte_is_refused():
    err = scenario_error(valid(extra='restart: {python: "bin/py\\0thon"}\n'))
    assert err.key == "restart.python"


# -- YAML is data: no tags that build objects, no expansion bombs ---------------------------------
def test_python_tags_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    for tag in ("!!python/object/apply:os.system", "!!python/object/new:os.system", "!!python/name:os.system"):
        err = scenario_error(valid(extra=f"tier: {tag} ['touch {marker}']\n"))
        assert "python" in str(err)
    assert not marker.exists()


def test_an_alias_bomb_is_refused_before_it_expands():
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    started = time.monotonic()
    err = scenario_error("\n".join(lines) + "\nname: *a9\n")
    assert f"more than {loader.MAX_NODES} values" in str(err)
    assert time.monotonic() - started < 10


def test_a_recursive_alias_and_deep_nesting_are_refused():
    too_deep = loader.MAX_DEPTH + 5
    assert f"deeper than {loader.MAX_DEPTH}" in str(scenario_error("name: &a [*a]\n"))
    assert f"deeper than {loader.MAX_DEPTH}" in str(scenario_error("name: " + "[" * too_deep + "]" * too_deep))
    assert "nesting too deep" in str(scenario_error("name: " + "[" * 5000))


def test_a_file_past_the_size_limit_is_refused_unread(tmp_path):
    big = tmp_path / "big.scenario.yaml"
    big.write_text(valid() + "#" * loader.MAX_FILE_BYTES + "\n")
    with pytest.raises(ScenarioError, match=f"{big}: <document>: larger than {loader.MAX_FILE_BYTES >> 10} KiB"):
        load_file(big)
    with pytest.raises(ScenarioError, match="larger than"):
        load_file("/dev/zero")  # endless: read no further than the limit


def test_a_matrix_that_multiplies_into_too_many_cases_is_refused():
    axes = "\n".join(f"  workload.{key}: [{', '.join(map(str, range(1, 11)))}]"
                     for key in ("seed", "steps", "checkpoint_every", "global_batch"))
    err = scenario_error(valid(extra=f"matrix:\n{axes}\n"))
    assert err.key == "matrix" and f"at most {loader.MAX_CASES}" in str(err)


# -- the fuzzer: random bytes and hostile documents, only ScenarioError escapes ------------------
TRAVERSALS = ESCAPES + ["..\\..\\x", "*/../*", "step_*/*", "*", "latest", "\u202e.pt", "%2e%2e/x", "", " "]
NAMES = sorted({*registry.STRATEGIES, *registry.FAULTS, *registry.WORKLOADS}) + [
    "no.such.module:Thing", "os:system", "resilience.scenario.loader:ScenarioError", "tests.strategies_under_test:Nope"]
printable = st.characters(blacklist_categories=("Cs",))  # a lone surrogate cannot be written as UTF-8
hostile_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-2, 70)
                   | st.sampled_from([10**400, -(10**400), 2**63, 2**31, -1, 0])
                   | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([math.nan, math.inf, 1e308])
                   | st.text(printable, max_size=16) | st.sampled_from(TRAVERSALS + NAMES))
hostile_values = st.recursive(hostile_scalars, lambda inner: st.lists(inner, max_size=3)
                              | st.dictionaries(st.text(printable, max_size=6) | st.integers(), inner, max_size=3),
                              max_leaves=12)


FAULT_PARAMS = sorted({key for name in registry.FAULTS for key in registry.resolve("fault", name).params})
KEY_PATHS = ["name", "description", "tier", "strategy", "strategy.name", "strategy.options",
             "strategy.options.inner", "strategy.options.keep_last", "strategy.options.stagger",
             *(f"workload.{key}" for key in loader.WORKLOAD_KEYS), "workload.options.x",
             *(f"fault.{key}" for key in ("kind", *loader.TRIGGER_KEYS, *FAULT_PARAMS)),
             *(f"restart.{key}" for key in loader.RESTART_KEYS), "restart.topology.tp", "restart.topology.node_ids",
             *(f"topology.{key}" for key in loader.TOPOLOGY_KEYS), "expect", "expect.outcome", "expect.error",
             "expect.fallback_ok", "known_issue", "known_issue.verdict", "known_issue.reason", "timeouts",
             "timeouts.collective", "timeouts.phase", "matrix", "matrix.fault.file", "matrix.restart.python"]
PLAUSIBLE = ["torch.per_rank", "torch.rank0", "manifest", "mlp", "tp_mlp", "identity", "reverse", "save", "train",
             "start", "write", "close", "returned", "recovers", "fails_loudly", "LOUD", "SILENT", "smoke", "shared",
             "node_local", "64KiB", "4KiB", "middle", "older", "helper", "*", "*_rank_1.pt", "step_*/*", 1, 2, 4, 8]
TRIGGER = {"rank": 1, "step": 8}
FAULTS = [{"kind": "none"}, {"kind": "power_loss", "step": 8},
          {"kind": "disk_full", **TRIGGER, "point": "write", "after_bytes": 4096},
          {"kind": "stale_pointer", **TRIGGER, "file": "latest"},
          *({"kind": kind, **TRIGGER, "source": "step_*/*_rank_0.pt"} for kind in ("duplicate_file", "straggler")),
          *({"kind": kind, **TRIGGER, "seconds": 3} for kind in ("stall", "partition", "throttle")),
          {"kind": "slow_read", **TRIGGER, "bytes_per_s": 1e6},
          *({"kind": kind, **TRIGGER} for kind in ("bit_flip", "kill", "missing_file", "preempt", "read_error",
                                                   "read_only", "truncate", "version_mismatch", "zero_block"))]
values = hostile_values | st.sampled_from(PLAUSIBLE) | st.lists(st.sampled_from(PLAUSIBLE), max_size=3)
base_documents = st.fixed_dictionaries({
    "name": st.just("hostile"), "description": st.just("d"),
    "strategy": st.sampled_from(["torch.per_rank", "torch.rank0", "none"]),
    "workload": st.just({"world_size": 2, "steps": 12, "checkpoint_every": 4}),
    "fault": st.sampled_from(FAULTS),
    "expect": st.sampled_from(["recovers", "fails_loudly"])})


def with_changes(document: dict, changes: dict) -> dict:
    """``document`` with each dotted key path set, through whatever stands in the way."""
    document = copy.deepcopy(document)  # st.just hands out the same object every time
    for key_path, value in changes.items():
        *parents, last = key_path.split(".")
        node = document
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {"name": node[part]} if part == "strategy" and isinstance(node.get(part), str) else {}
            node = node[part]
        node[last] = value
    return document


documents = st.builds(with_changes, base_documents,
                      st.dictionaries(st.sampled_from(KEY_PATHS), values, min_size=1, max_size=3))

yaml_fragments = st.sampled_from(
    ["name: ", "fault: ", "  file: ", "strategy: ", "workload: ", "matrix:\n", "- ", "{", "}", "[", "]", ", ",
     ": ", "&a ", "*a", "<<: *a", "? ", "!!python/object/apply:os.system ", "!!binary ", "!!int ", "!!float ",
     "!!set ", "!!omap ", "!!timestamp ", "!<tag:yaml.org,2002:str> ", "'", '"', "\n", "\n  ", "\t", "---\n",
     "...\n", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "|\n", ">-\n", "\\0", "\x00", "\ufeff", "../..", "~",
     "1e400", ".nan", "-.inf", "0x" + "f" * 40, "9" * 5000])


def check_loads_or_names_the_file(path: Path) -> None:
    """Only `ScenarioError` naming ``path`` escapes; a loaded case names no path outside its directory."""
    try:
        scenario = load_file(path)
    except ScenarioError as err:
        assert str(err).startswith(f"{path}: "), str(err)
        return
    assert isinstance(scenario, Scenario) and scenario.cases
    for case in scenario.cases:
        trigger = case.fault.trigger
        globs = [trigger.file] if trigger else []
        globs += [v for k, v in case.fault.params.items() if isinstance(v, str) and k in ("source", "once_written")]
        assert all(relative_glob_problem(g) is None for g in globs), globs


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory) / "fuzzed.scenario.yaml"


@FUZZ
@given(st.binary(max_size=400) | st.text(printable, max_size=300).map(str.encode)
       | st.lists(yaml_fragments | st.text(printable, max_size=4), max_size=40).map(lambda p: "".join(p).encode()))
def test_random_bytes_in_a_scenario_file_load_or_name_the_file(scratch, data):
    scratch.write_bytes(data)
    check_loads_or_names_the_file(scratch)


@FUZZ
@given(documents)
def test_hostile_documents_around_the_schema_load_or_name_the_file(scratch, document):
    scratch.write_text(yaml.safe_dump(document, allow_unicode=True, sort_keys=False), encoding="utf-8")
    check_loads_or_names_the_file(scratch)


# -- at run time: a match is refused unless it really lies inside --------------------------------
def test_the_resolver_refuses_a_symlink_that_points_out(tmp_path):
    root, outside = tmp_path / "checkpoints", tmp_path / "victim.pt"
    (root / "step_4").mkdir(parents=True)
    outside.write_bytes(b"precious")
    (root / "step_4" / "ckpt.pt").write_bytes(b"ours")
    (root / "step_4" / "escape.pt").symlink_to(outside)
    (root / "step_4" / "alias.pt").symlink_to("ckpt.pt")
    (root / "out").symlink_to(tmp_path, target_is_directory=True)
    assert resolve_under(root, "step_4/ckpt.pt") == root / "step_4" / "ckpt.pt"
    assert resolve_under(root, "step_4/alias.pt") == root / "step_4" / "alias.pt"  # a link that stays inside
    for relative in ("step_4/escape.pt", "out/victim.pt", "../victim.pt", str(outside)):
        with pytest.raises(PathEscape, match="outside that directory"):
            resolve_under(root, relative)


def snapshot(directory: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(directory)): (p.lstat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
            for p in sorted(directory.rglob("*"))}


@pytest.fixture
def beside_the_work_root(tmp_path):
    """A work root and, beside it, a sentinel directory holding a victim file no case may touch."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "victim.pt").write_bytes(os.urandom(4096))
    return tmp_path / "work", sentinel


def test_a_fault_whose_glob_matches_only_outside_touches_nothing(beside_the_work_root):
    work, sentinel = beside_the_work_root
    before, neighbours = snapshot(sentinel), sorted(os.listdir(sentinel.parent))
    result = run_case(work, workload={"steps": 12},
                      fault={"kind": "truncate", "rank": 1, "step": 8, "file": "*victim*", "keep": 0})
    assert not result.fault_fired
    assert snapshot(sentinel) == before
    assert sorted(os.listdir(sentinel.parent)) == neighbours + ["work"]
    assert os.listdir(work) == []  # the case directory is gone too


def test_a_symlink_planted_by_the_strategy_is_not_followed_out(beside_the_work_root):
    work, sentinel = beside_the_work_root
    before = snapshot(sentinel)
    result = run_case(work, workload={"steps": 12},
                      strategy={"name": "tests.strategies_under_test:PlantsSymlinkOut",
                                "options": {"link_to": str(sentinel / "victim.pt")}},
                      fault={"kind": "truncate", "rank": 1, "step": 8, "file": "step_*/escape.pt", "keep": 0})
    assert snapshot(sentinel) == before
    first_run = result.phase("first_run")
    assert first_run.first_error is not None and first_run.first_error.type == "PathEscape", first_run.first_error
    assert "outside that directory" in first_run.first_error.message
