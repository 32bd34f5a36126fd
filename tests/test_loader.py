"""Unit tests for `resilience.scenario.loader`: scenario YAML -> validated, matrix-expanded cases.

The loader's contract: a malformed file raises `ScenarioError` (never anything else) naming the file,
the key path, the bad value and what is allowed; a good file expands into cases that survive the
JSON trip to the rank processes unchanged. No rank process is started here.
"""
from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resilience.core import registry
from resilience.core.case import Case, Outcome, Scenario, VerdictKind
from resilience.errors import ScenarioError
from resilience.scenario.discovery import is_scenario_file
from resilience.scenario.loader import DEFAULT_TIMEOUTS, load_document, load_file, load_text, parse_case, parse_size
from resilience.strategies.base import CheckpointStrategy

SOURCE = "some/path.scenario.yaml"
SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"
SHIPPED = sorted(SCENARIO_DIR.glob("*.scenario.yaml"))
DROP = object()  # in `variant`: remove this key
ANY = object()  # in the error table: do not check this field

BASE = {
    "name": "base scenario",
    "description": "a valid scenario the error tests break one key of",
    "strategy": "torch.rank0",
    "workload": {"model": "mlp", "world_size": 2, "steps": 12, "checkpoint_every": 4, "seed": 0},
    "fault": {"kind": "kill", "rank": 0, "step": 8, "point": "start"},
    "expect": "recovers",
}


def variant(changes: dict | None = None, base: dict = BASE) -> dict:
    """BASE with dotted key paths set (or removed with DROP)."""
    doc = copy.deepcopy(base)
    for key_path, value in (changes or {}).items():
        *parents, last = key_path.split(".")
        node = doc
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if value is DROP:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


def dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def load(doc: dict | str) -> Scenario:
    return load_text(doc if isinstance(doc, str) else dump(doc), SOURCE)


def scenario_error(doc: dict | str) -> ScenarioError:
    """The ScenarioError loading `doc` raises; its message always starts with the file path."""
    with pytest.raises(ScenarioError) as info:
        load(doc)
    err = info.value
    assert str(err).startswith(f"{SOURCE}: "), str(err)
    assert err.path == SOURCE
    return err


def json_round_trip(case: Case) -> Case:
    """What a rank does with what the harness writes (`Case.write`, `Case.read`)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "case.json"
        case.write(path)
        return Case.read(path)


class OptionStrategy(CheckpointStrategy):
    """A plug-in strategy loaded by import path, with one option."""

    options = ("keep",)

    def save(self, workload, step):
        pass

    def load(self, workload):
        pass


# ---------------------------------------------------------------------------------------------------
# Malformed scenarios: the error names file, key path, value and what is allowed
# ---------------------------------------------------------------------------------------------------

# (id, changes to BASE, key, value, fragment of `allowed` or of the message)
MALFORMED = [
    ("unknown top-level key", {"colour": "red"}, "colour", "colour", "workload"),
    ("unknown workload key", {"workload.ranks": 2}, "workload.ranks", "ranks", "world_size"),
    ("unknown fault kind", {"fault.kind": "explode"}, "fault.kind", "explode", "kill, disk_full"),
    ("missing fault kind", {"fault.kind": DROP}, "fault.kind", None, "none, kill, disk_full"),
    ("fault not a mapping", {"fault": 3}, "fault", 3, "none, kill, disk_full"),
    ("unknown strategy", {"strategy": "torch.magic"}, "strategy", "torch.magic", "torch.rank0, torch.per_rank"),
    ("unknown strategy, mapping form", {"strategy": {"name": "torch.magic"}}, "strategy.name", "torch.magic",
     "package.module:Class"),
    ("unknown strategy key", {"strategy": {"name": "torch.rank0", "flavour": 1}}, "strategy.flavour",
     "flavour", "name, options"),
    ("strategy option the strategy lacks", {"strategy": {"name": "torch.rank0", "options": {"x": 1}}},
     "strategy.options.x", "x", ANY),
    ("unimportable strategy module", {"strategy": "no_such_pkg.mod:Saver"}, "strategy",
     "no_such_pkg.mod:Saver", "package.module:Class"),
    ("missing class in a real module", {"strategy": "resilience.strategies.noop:Missing"}, "strategy",
     "resilience.strategies.noop:Missing", "package.module:Class"),
    ("import path to a non-strategy", {"strategy": "resilience.faults.process.kill:Kill"}, "strategy",
     "resilience.faults.process.kill:Kill", "torch.rank0"),
    ("unknown workload model", {"workload.model": "gpt"}, "workload.model", "gpt", "mlp"),
    ("world_size 0", {"workload.world_size": 0}, "workload.world_size", 0, "1..64"),
    ("world_size too large", {"workload.world_size": 65}, "workload.world_size", 65, "1..64"),
    ("world_size not an int", {"workload.world_size": "two"}, "workload.world_size", "two", "1..64"),
    ("world_size a bool", {"workload.world_size": True}, "workload.world_size", True, "1..64"),
    ("fault rank == world_size", {"fault.rank": 2}, "fault.rank", 2, "0..1"),
    ("fault rank negative", {"fault.rank": -1}, "fault.rank", -1, "0..1"),
    ("missing name", {"name": DROP}, "name", None, None),
    ("description not a string", {"description": 5}, "description", 5, None),
    ("empty description", {"description": " "}, "description", " ", None),
    ("missing workload", {"workload": DROP}, "workload", None, None),
    ("missing workload.steps", {"workload.steps": DROP}, "workload.steps", None, None),
    ("missing workload.world_size", {"workload.world_size": DROP}, "workload.world_size", None, None),
    ("missing expect", {"expect": DROP}, "expect", None, "recovers, fails_loudly"),
    ("missing strategy", {"strategy": DROP}, "strategy", None, "torch.rank0"),
    ("empty name", {"name": "  "}, "name", "  ", None),
    ("name not a string", {"name": 5}, "name", 5, None),
    ("checkpoint_every > steps", {"workload.checkpoint_every": 13}, "workload.checkpoint_every", 13,
     "1..steps (12)"),
    ("save fault at a step without a checkpoint", {"fault.step": 6}, "fault.step", 6, "4, 8, 12"),
    ("fault step past the end", {"fault.step": 13, "fault.phase": "train"}, "fault.step", 13, "1..12"),
    ("unknown fault phase", {"fault.phase": "load"}, "fault.phase", "load", "save, train"),
    ("unknown fault point", {"fault.point": "flush"}, "fault.point", "flush", "start, open, write, fsync, close"),
    ("train phase has only start", {"fault.phase": "train", "fault.step": 6, "fault.point": "write"},
     "fault.point", "write", "start"),
    ("point write without after_bytes", {"fault.point": "write"}, "fault.after_bytes", None, ANY),
    ("after_bytes at a point without bytes", {"fault.after_bytes": 10}, "fault.after_bytes", 10, "points write"),
    ("after_bytes not a size", {"fault.point": "write", "fault.after_bytes": "lots"}, "fault.after_bytes",
     "lots", "4KiB"),
    ("absolute fault file", {"fault.file": "/etc/passwd"}, "fault.file", "/etc/passwd", "relative to the checkpoint"),
    ("fault file escaping", {"fault.file": "../x.pt"}, "fault.file", "../x.pt", "relative to the checkpoint"),
    ("trigger keys on the no-op fault", {"fault": {"kind": "none", "rank": 0}}, "fault.rank", "rank", "kind"),
    ("disk_full via tmpfs, point write",
     {"fault": {"kind": "disk_full", "via": "tmpfs", "rank": 0, "step": 8, "point": "write", "after_bytes": 8192}},
     "fault.point", "write", "start"),
    ("disk_full via quota, point start",
     {"fault": {"kind": "disk_full", "via": "quota", "rank": 0, "step": 8, "point": "start", "after_bytes": 1}},
     "fault.point", "start", "write, fsync, close"),
    ("disk_full unknown via",
     {"fault": {"kind": "disk_full", "via": "nfs", "rank": 0, "step": 8, "after_bytes": 1}},
     "fault.via", "nfs", "quota, tmpfs"),
    ("global_batch not divisible", {"workload.global_batch": 15}, "workload.global_batch", 15,
     "a multiple of the world size"),
    ("restart world size not dividing the batch", {"restart.world_size": 3}, "restart.world_size", 3,
     "1, 2, 4, 8, 16"),
    ("rank_map repeats a rank", {"restart.rank_map": [0, 0]}, "restart.rank_map", [0, 0], "each of 0..1 once"),
    ("rank_map out of range", {"restart.rank_map": [1, 2]}, "restart.rank_map", [1, 2], "each of 0..1 once"),
    ("rank_map too short", {"restart.rank_map": [0]}, "restart.rank_map", [0], "each of 0..1 once"),
    ("rank_map mixing types", {"restart.rank_map": [0, "a"]}, "restart.rank_map", [0, "a"], "each of 0..1 once"),
    ("rank_map of bools", {"restart.rank_map": [True, False]}, "restart.rank_map", [True, False], "identity"),
    ("rank_map unknown word", {"restart.rank_map": "shuffle"}, "restart.rank_map", "shuffle", "reverse"),
    ("permuted rank_map with a new world size", {"restart": {"world_size": 4, "rank_map": "reverse"}},
     "restart.rank_map", "reverse", "identity"),
    ("known_issue verdict equal to the expected one",
     {"known_issue": {"reason": "r", "link": "l", "verdict": "RECOVERED"}}, "known_issue.verdict",
     "RECOVERED", "LOUD, SILENT, HANG"),
    ("known_issue unknown verdict", {"known_issue": {"reason": "r", "link": "l", "verdict": "MEH"}},
     "known_issue.verdict", "MEH", "RECOVERED, LOUD, SILENT, HANG"),
    ("known_issue without a link", {"known_issue": {"reason": "r", "verdict": "SILENT"}}, "known_issue.link",
     None, None),
    ("unknown expected outcome", {"expect": "explodes"}, "expect", "explodes", "recovers, fails_loudly"),
    ("unknown expected outcome, mapping form", {"expect": {"outcome": "explodes"}}, "expect.outcome",
     "explodes", "recovers, fails_loudly"),
    ("expect.error not a regex", {"expect": {"outcome": "fails_loudly", "error": "unexpected ("}},
     "expect.error", "unexpected (", None),
    ("expect.error without fails_loudly", {"expect": {"outcome": "recovers", "error": "x"}}, "expect.error",
     "x", None),
    ("expect.fallback_ok not a bool", {"expect": {"outcome": "recovers", "fallback_ok": "yes"}},
     "expect.fallback_ok", "yes", None),
    ("unknown tier", {"tier": "nightly"}, "tier", "nightly", "smoke, full"),
    ("zero timeout", {"timeouts.phase": 0}, "timeouts.phase", 0, "a number > 0"),
    ("timeout not a number", {"timeouts.collective": "soon"}, "timeouts.collective", "soon", "a number > 0"),
    ("infinite timeout", {"timeouts.phase": float("inf")}, "timeouts.phase", float("inf"), "a number > 0"),
    ("timeout too large for a float", {"timeouts.phase": 10**400}, "timeouts.phase", 10**400, "a number > 0"),
    ("timeout longer than a week", {"timeouts.collective": 10**9}, "timeouts.collective", 10**9, "<= 604800"),
    ("unknown timeout", {"timeouts.save": 3}, "timeouts.save", "save", "collective, phase"),
    ("fractional size", {"workload.size": "1.5MiB"}, "workload.size", "1.5MiB", "KiB, MiB, GiB"),
    ("size under 1KiB", {"workload.size": 512}, "workload.size", 512, "KiB"),
    ("unknown rank_rng", {"workload.rank_rng": "per_rank"}, "workload.rank_rng", "per_rank", "same, distinct"),
    ("workload options not a mapping", {"workload.options": 5}, "workload.options", 5, None),
    ("workload options not JSON", {"workload.options": {1: "int key"}}, "workload.options", {1: "int key"}, None),
    ("empty matrix mapping", {"matrix": {}}, "matrix", {}, "a list of mappings"),
    ("empty matrix list", {"matrix": []}, "matrix", [], "a list of mappings"),
    ("matrix a scalar", {"matrix": 5}, "matrix", 5, "a list of mappings"),
    ("matrix axis not a list", {"matrix": {"fault.rank": 1}}, "matrix.fault.rank", 1, None),
    ("matrix axis empty", {"matrix": {"fault.rank": []}}, "matrix.fault.rank", [], None),
    ("matrix entry not a mapping", {"matrix": [{"strategy": "torch.rank0"}, "x"]}, "matrix[1]", "x", None),
    ("matrix key not a key path", {"matrix": {"fault..rank": [1]}}, "matrix", "fault..rank", None),
    ("matrix key path unknown", {"matrix": {"colour.hue": [1]}}, "matrix.colour.hue", "colour.hue", "workload"),
    ("matrix inside the matrix", {"matrix": {"matrix.x": [1]}}, "matrix.matrix.x", "matrix.x", "workload"),
    ("matrix through a scalar", {"matrix": {"name.x": [1]}}, "matrix.name.x", "base scenario", None),
    ("matrix cases with equal ids", {"matrix": {"fault.rank": [1, 1]}}, "matrix", None, ANY),
]


@pytest.mark.parametrize("changes,key,value,allowed", [case[1:] for case in MALFORMED],
                         ids=[case[0] for case in MALFORMED])
def test_malformed_scenario_names_file_key_value_and_allowed(changes, key, value, allowed):
    """Every check reports where (file, key path), what (value) and what would do (allowed)."""
    err = scenario_error(variant(changes))
    message = str(err)
    assert err.key == key, message
    assert f": {key}: " in message
    if value is not ANY:
        assert err.value == value, message
        if value is not None:
            assert f"got {value!r}" in message
    if allowed is None:
        assert err.allowed in (None, ""), message
    elif allowed is not ANY:
        assert allowed in err.allowed, message
        assert f"allowed: {err.allowed}" in message


def test_missing_required_field_says_missing():
    """A missing key reads as missing, not as a type error about None."""
    for key_path in ("name", "workload", "workload.steps", "expect"):
        err = scenario_error(variant({key_path: DROP}))
        assert "missing required key" in str(err), str(err)


def test_description_is_optional_and_defaults_to_the_name():
    """A new user's first file often has no description: the name stands in for it, in every case."""
    for absent in (DROP, None):
        scenario = load(variant({"description": absent, "matrix": {"fault.rank": [0, 1]}}))
        assert [case.description for case in scenario.cases] == ["base scenario", "base scenario"]
        for case in scenario.cases:
            assert json_round_trip(case) == case


def test_every_mistake_of_a_file_is_reported_in_one_error():
    """Three independent mistakes: one error, one line each, every line as that mistake alone reads."""
    mistakes = {"colour": "red", "strategy": "torch.per_rnk", "tier": "nightly"}
    err = scenario_error(variant(mistakes))
    alone = {key: str(scenario_error(variant({key: value}))) for key, value in mistakes.items()}
    lines = str(err).splitlines()
    assert len(lines) == 3, str(err)
    assert sorted(lines) == sorted(alone.values())
    assert all(line.startswith(f"{SOURCE}: ") for line in lines)
    assert err.key == "colour"  # the first problem's key, for callers that look at one
    assert lines[0] == alone["colour"]
    assert sorted(str(p) for p in err.problems) == sorted(alone.values())  # each, for tools
    assert sorted(p.key for p in err.problems) == ["colour", "strategy", "tier"]


def test_a_mistake_the_matrix_repeats_is_reported_once_and_distinct_ones_each():
    """The same bad value in every case of a matrix is one problem; two different bad values are two."""
    err = scenario_error(variant({"tier": "nightly", "matrix": {"strategy": ["torch.rank0", "torch.per_rank"]}}))
    assert len(str(err).splitlines()) == 1 and err.key == "tier (matrix case strategy=torch.rank0)"
    err = scenario_error(variant({"matrix": {"fault.rank": [2, 3]}}))
    assert [line.split(": ")[1] for line in str(err).splitlines()] == [
        "fault.rank (matrix case fault.rank=2)", "fault.rank (matrix case fault.rank=3)"]


def test_many_problems_are_listed_up_to_a_limit():
    err = scenario_error(variant({f"unknown_{i}": i for i in range(30)}))
    lines = str(err).splitlines()
    assert len(lines) == 21 and lines[-1] == f"{SOURCE}: and 10 more problems"


def test_a_mistyped_strategy_lists_the_allowed_names_once_and_suggests_the_near_one():
    err = scenario_error(variant({"strategy": "torch.per_rnk"}))
    message = str(err)
    assert message.count("allowed:") == 1, message
    assert "did you mean 'torch.per_rank'?" in message
    assert err.allowed == ", ".join([*registry.STRATEGIES, "package.module:Class"])
    assert "did you mean" not in str(scenario_error(variant({"strategy": "torch.magic"})))  # nothing close


@pytest.mark.parametrize("changes,key,suggestion", [
    ({"fault.kind": "partiton"}, "fault.kind", "partition"),
    ({"workload.model": "mlpp"}, "workload.model", "mlp"),
    ({"descripton": "d"}, "descripton", "description"),
    ({"workload.world_sise": 2}, "workload.world_sise", "world_size"),
    ({"strategy": {"name": "torch.rank0", "optoins": {}}}, "strategy.optoins", "options"),
    ({"tier": "smok"}, "tier", "smoke"),
], ids=["fault kind", "workload model", "top-level key", "workload key", "strategy key", "tier"])
def test_near_misses_get_a_did_you_mean(changes, key, suggestion):
    err = scenario_error(variant(changes))
    assert err.key == key, str(err)
    assert f"(did you mean {suggestion!r}?)" in str(err)
    assert str(err).count("allowed:") == 1, str(err)


def test_unknown_strategy_lists_builtins_and_import_form():
    """The user learns both the built-in names and that `package.module:Class` exists."""
    err = scenario_error(variant({"strategy": "torch.magic"}))
    assert "unknown strategy 'torch.magic'" in str(err)
    assert err.allowed == ", ".join(list(registry.STRATEGIES) + ["package.module:Class"])
    assert "torch.rank0" in err.allowed and "deepspeed.zero3" in err.allowed


def test_unimportable_strategy_says_why():
    """An import path that cannot be imported carries the import error."""
    err = scenario_error(variant({"strategy": "no_such_pkg.mod:Saver"}))
    assert "cannot import strategy 'no_such_pkg.mod:Saver'" in str(err)
    assert "ModuleNotFoundError" in str(err)


def test_strategy_module_raising_at_import_is_a_scenario_error(tmp_path, monkeypatch):
    """A plug-in module that raises while imported still yields a ScenarioError (it used to escape)."""
    (tmp_path / "boom_strategy_for_loader_test.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    err = scenario_error(variant({"strategy": "boom_strategy_for_loader_test:Saver"}))
    assert err.key == "strategy"
    assert "RuntimeError: boom at import" in str(err)


def test_unknown_fault_kind_lists_kinds():
    err = scenario_error(variant({"fault.kind": "explode"}))
    assert "unknown fault 'explode'" in str(err)
    assert err.allowed.startswith("none, kill, disk_full, stall, partition, throttle, preempt, version_mismatch, ")
    assert err.allowed == ", ".join([*registry.FAULTS, "package.module:Class"])  # every built-in kind, then plug-ins


def test_fault_rank_error_explains_range_from_world_size():
    """The allowed ranks are derived from workload.world_size, and the message says so."""
    err = scenario_error(variant({"workload.world_size": 4, "fault.rank": 4}))
    assert err.allowed == "0..3 (workload.world_size is 4)"


def test_save_fault_step_lists_checkpoint_steps():
    err = scenario_error(variant({"workload.checkpoint_every": 5, "fault.step": 4}))
    assert "no checkpoint is saved at this step" in str(err)
    assert err.allowed == "5, 10"


def test_known_issue_equal_to_expectation_lists_other_verdicts():
    """A known issue that predicts the expected verdict is no issue: the other verdicts are offered."""
    err = scenario_error(variant({"expect": "fails_loudly",
                                  "known_issue": {"reason": "r", "link": "l", "verdict": "LOUD"}}))
    assert err.key == "known_issue.verdict"
    assert err.value == "LOUD"
    assert err.allowed == "RECOVERED, SILENT, HANG"


def test_expect_error_invalid_regex_carries_regex_problem():
    err = scenario_error(variant({"expect": {"outcome": "fails_loudly", "error": "["}}))
    assert "not a valid regular expression" in str(err)
    assert "got '['" in str(err)


def test_disk_full_tmpfs_only_at_start():
    err = scenario_error(variant({"fault": {"kind": "disk_full", "via": "tmpfs", "rank": 0, "step": 8,
                                            "point": "close", "after_bytes": 8192}}))
    assert "via tmpfs" in str(err)
    assert (err.key, err.value, err.allowed) == ("fault.point", "close", "start")


def test_point_write_needs_after_bytes():
    """`point: write` on a kill without a byte offset cannot say where to cut the file."""
    err = scenario_error(variant({"fault.point": "write"}))
    assert err.key == "fault.after_bytes"
    assert "point 'write' needs a byte offset" in str(err)


def test_bad_matrix_case_names_the_case():
    """An error that only one matrix case has says which case, in the key path."""
    err = scenario_error(variant({"matrix": {"strategy": ["torch.rank0", "torch.per_rank"],
                                             "fault.rank": [0, 1, 2]}}))
    assert err.key == "fault.rank (matrix case strategy=torch.rank0,fault.rank=2)"
    assert err.value == 2
    assert "0..1" in err.allowed


def test_bad_matrix_list_case_names_the_case():
    err = scenario_error(variant({"matrix": [{"strategy": "torch.rank0"}, {"strategy": "torch.nope"}]}))
    assert err.key == "strategy (matrix case strategy=torch.nope)"
    assert err.value == "torch.nope"


def test_parse_case_rejects_a_matrix():
    """A case document is already expanded; a matrix in it means a caller mixed things up."""
    with pytest.raises(ScenarioError, match=r"some/path\.scenario\.yaml: matrix: a case document cannot carry"):
        parse_case(variant({"matrix": {"fault.rank": [0]}}), SOURCE)


def test_document_must_be_a_mapping():
    for text in ("- a\n- b\n", "just a string\n", "", "42\n"):
        err = scenario_error(text)
        assert err.key == ""
        assert f"{SOURCE}: <document>: must be a mapping" in str(err)


# -- YAML level ---------------------------------------------------------------------------------------

def test_yaml_syntax_error_names_the_line():
    text = "name: n\ndescription: d\nworkload: {steps: 1\nexpect: recovers\n"
    err = scenario_error(text)
    assert err.key == ""
    assert re.search(r"YAML syntax error at line \d+, column \d+", str(err)), str(err)


def test_yaml_syntax_error_bad_indentation():
    err = scenario_error("name: n\n  description: d\n")
    assert "YAML syntax error at line 2" in str(err), str(err)


def test_duplicate_key_is_an_error_not_last_wins():
    """Plain YAML keeps the last duplicate silently; a scenario must not."""
    err = scenario_error(dump(BASE) + "name: again\n")
    assert "duplicate key 'name'" in str(err)
    line = dump(BASE).count("\n") + 1
    assert f"at line {line}, column 1" in str(err)


def test_nested_duplicate_key_is_an_error():
    text = dump(variant({"workload": DROP})) + "workload:\n  world_size: 2\n  steps: 12\n  world_size: 4\n"
    err = scenario_error(text)
    assert "duplicate key 'world_size'" in str(err)


@pytest.mark.parametrize("text", [
    "name: 2001-13-45\n",  # looks like a date, is not one: ValueError inside PyYAML
    "name: !!int abc\n",
    "name: !!float abc\n",
    "name: !!timestamp abc\n",
    "name: " + "1" * 5000 + "\n",  # more digits than int() converts by default
])
def test_yaml_value_pyyaml_cannot_construct_is_a_scenario_error(text):
    """PyYAML raises ValueError & co. for these; the loader reports them with the line."""
    err = scenario_error(text)
    assert "at line 1, column 7: invalid value" in str(err), str(err)


def test_yaml_complex_key_is_a_scenario_error():
    """`? [a]` makes an unhashable key; it used to escape as TypeError."""
    err = scenario_error("? [a, b]\n: 1\n")
    assert "mapping key must be a scalar" in str(err)
    assert "at line 1" in str(err)


@pytest.mark.parametrize("text", ["[" * 5000, "a: " + "{a: " * 3000, "name: \x00\n", "x: &a [*a]\n",
                                  "--- a\n--- b\n", "name: !!python/name:os.system ''\n"])
def test_hostile_yaml_is_a_scenario_error(text):
    """Deep nesting, control characters, self-referencing aliases, several documents, python tags."""
    scenario_error(text)


def test_yaml_merge_keys_work():
    """`<<: *anchor` is standard YAML; the duplicate-key check used to reject it."""
    text = dump(variant({"fault": DROP, "expect": DROP})) + (
        "fault: &f {kind: kill, rank: 0, step: 8}\n"
        "expect: recovers\n"
        "matrix:\n"
        "  - fault: {<<: *f, rank: 1}\n"
        "  - fault: {<<: *f, phase: train, step: 6}\n")
    first, second = load(text).cases
    assert (first.fault.trigger.rank, first.fault.trigger.step) == (1, 8)
    assert (second.fault.trigger.phase, second.fault.trigger.step, second.fault.trigger.rank) == ("train", 6, 0)


def test_load_file_unreadable(tmp_path):
    """Missing files, directories and non-UTF-8 bytes all name the path."""
    missing = tmp_path / "missing.scenario.yaml"
    with pytest.raises(ScenarioError, match=re.escape(str(missing)) + ".*cannot read the file"):
        load_file(missing)
    with pytest.raises(ScenarioError, match="cannot read the file"):
        load_file(tmp_path)
    binary = tmp_path / "binary.scenario.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ScenarioError, match=re.escape(str(binary)) + ".*cannot read the file"):
        load_file(binary)


def test_scenario_error_attributes():
    """The pieces of the message are also attributes, for tools that render them differently."""
    err = ScenarioError("f.yaml", "a.b", "broken", 3, ["x", 1])
    assert (err.path, err.key, err.problem, err.value, err.allowed) == ("f.yaml", "a.b", "broken", 3, "x, 1")
    assert str(err) == "f.yaml: a.b: broken; got 3; allowed: x, 1"
    assert str(ScenarioError("f.yaml", "", "bad")) == "f.yaml: <document>: bad"


# ---------------------------------------------------------------------------------------------------
# Valid scenarios
# ---------------------------------------------------------------------------------------------------

def test_scenarios_are_shipped():
    assert len(SHIPPED) >= 8, SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_scenario_loads_and_round_trips(path):
    """Every shipped file is valid, its case ids are unique, and each case survives the trip to a worker."""
    scenario = load_file(path)
    assert scenario.path == str(path)
    assert scenario.cases
    ids = [case.id for case in scenario.cases]
    assert len(set(ids)) == len(ids), ids
    for case in scenario.cases:
        assert case.name == scenario.name
        assert case.source == str(path)
        assert re.fullmatch(r"[\w.*=,-]+", case.id), case.id
        assert parse_case(case.document, case.source, case.id) == case
        assert json_round_trip(case) == case


def test_shipped_cartesian_matrix_ids():
    """disk_full: 2 strategies x 2 points, in file order, ids `key=value` joined by commas."""
    scenario = load_file(SCENARIO_DIR / "disk_full.scenario.yaml")
    assert [case.id for case in scenario.cases] == [
        "strategy=torch.rank0,fault.point=write", "strategy=torch.rank0,fault.point=close",
        "strategy=torch.per_rank,fault.point=write", "strategy=torch.per_rank,fault.point=close"]
    assert [(c.strategy.name, c.fault.trigger.point) for c in scenario.cases] == [
        ("torch.rank0", "write"), ("torch.rank0", "close"), ("torch.per_rank", "write"), ("torch.per_rank", "close")]
    assert all(c.fault.params == {"via": "quota", "on": "checkpoint"} and c.fault.trigger.after_bytes == 8192
               for c in scenario.cases)
    assert all(c.tier == "smoke" for c in scenario.cases)


def test_shipped_list_matrix_overrides_several_keys():
    """world_size_change: the second case changes world size, fault rank, restart and expectation at once."""
    first, second = load_file(SCENARIO_DIR / "world_size_change.scenario.yaml").cases
    assert first.id == "strategy=torch.rank0"
    assert (first.workload.world_size, first.fault.trigger.rank, first.restart.world_size) == (4, 3, 2)
    assert first.expect.outcome is Outcome.RECOVERS
    assert second.id.startswith("strategy=torch.per_rank,workload.world_size=2,fault.rank=1,restart.world_size=4")
    assert (second.workload.world_size, second.fault.trigger.rank, second.restart.world_size) == (2, 1, 4)
    assert second.expect.outcome is Outcome.FAILS_LOUDLY and second.expect.error == "No such file"
    assert second.topology_changes and first.topology_changes


def test_shipped_known_issue():
    per_rank, rank0 = load_file(SCENARIO_DIR / "rank0_distinct_rng.scenario.yaml").cases
    assert per_rank.known_issue is None
    assert rank0.known_issue.verdict is VerdictKind.SILENT
    assert rank0.workload.rank_rng == "distinct"
    assert rank0.fault.trigger.phase == "train" and rank0.fault.trigger.point == "start"


def test_mapping_matrix_is_the_cartesian_product():
    doc = variant({"workload.world_size": 4,
                   "matrix": {"strategy": ["torch.rank0", "torch.per_rank"], "fault.rank": [0, 2],
                              "workload.seed": [1, 2, 3]}})
    cases = load(doc).cases
    assert len(cases) == 12
    assert cases[0].id == "strategy=torch.rank0,fault.rank=0,workload.seed=1"
    assert "strategy=torch.rank0,fault.rank=2,workload.seed=3" in {c.id for c in cases}
    combos = {(c.strategy.name, c.fault.trigger.rank, c.workload.seed) for c in cases}
    assert combos == {(s, r, seed) for s in ("torch.rank0", "torch.per_rank") for r in (0, 2) for seed in (1, 2, 3)}
    for case in cases:  # the override touched one key; the rest of the section stayed
        assert (case.fault.kind, case.fault.trigger.step, case.fault.trigger.point) == ("kill", 8, "start")


def test_brief_style_case_id():
    doc = variant({"workload.world_size": 4, "matrix": {"strategy": ["torch.rank0"], "fault.rank": [2]}})
    (case,) = load(doc).cases
    assert case.id == "strategy=torch.rank0,fault.rank=2"


def test_list_matrix_is_explicit_cases_in_order():
    doc = variant({"matrix": [{"strategy": "torch.per_rank"},
                              {"strategy": "torch.rank0", "fault.rank": 1},
                              {"fault": {"kind": "none"}}]})
    cases = load(doc).cases
    assert [c.id for c in cases] == ["strategy=torch.per_rank", "strategy=torch.rank0,fault.rank=1",
                                     "fault.kind=none"]
    assert [c.strategy.name for c in cases] == ["torch.per_rank", "torch.rank0", "torch.rank0"]
    assert cases[1].fault.trigger.rank == 1 and cases[0].fault.trigger.rank == 0
    assert cases[2].fault.kind == "none" and cases[2].fault.trigger is None


def test_matrix_sets_keys_under_short_forms():
    """`strategy: x`, `expect: x` and `fault: x` are short for mappings; a matrix may set keys under them."""
    doc = variant({"expect": "fails_loudly", "fault": "none",
                   "matrix": [{"strategy.options": {}, "expect.error": "boom", "fault.kind": "none"}]})
    (case,) = load(doc).cases
    assert case.strategy.name == "torch.rank0"
    assert (case.expect.outcome, case.expect.error) == (Outcome.FAILS_LOUDLY, "boom")
    assert case.fault.kind == "none"
    doc = variant({"fault": "kill", "matrix": {"fault.rank": [0], "fault.step": [8]}})
    (case,) = load(doc).cases
    assert (case.fault.kind, case.fault.trigger.rank) == ("kill", 0)


def test_matrix_cases_do_not_share_state_and_input_is_untouched():
    """Each case gets its own copy; the caller's document is not modified by expansion."""
    doc = variant({"matrix": {"fault.rank": [0, 1]}})
    before = copy.deepcopy(doc)
    first, second = load_document(doc, SOURCE).cases
    assert doc == before
    assert first.document["fault"]["rank"] == 0 and second.document["fault"]["rank"] == 1
    assert "matrix" not in first.document


def test_no_matrix_means_one_case_named_case():
    (case,) = load(BASE).cases
    assert case.id == "case"


def test_defaults():
    """What a minimal scenario means: no fault, same world size, identity map, tier full, default timeouts."""
    doc = {"name": "n", "description": "d", "strategy": "torch.rank0",
           "workload": {"world_size": 2, "steps": 3, "checkpoint_every": 1}, "expect": "recovers"}
    scenario = load(doc)
    assert scenario.name == "n" and scenario.path == SOURCE
    (case,) = scenario.cases
    assert case.tier == "full"
    assert (case.fault.kind, case.fault.trigger, dict(case.fault.params)) == ("none", None, {})
    assert (case.restart.world_size, case.restart.rank_map) == (2, (0, 1))
    assert not case.topology_changes
    assert (case.timeouts.collective_s, case.timeouts.phase_s) == (DEFAULT_TIMEOUTS["collective"],
                                                                  DEFAULT_TIMEOUTS["phase"])
    w = case.workload
    assert (w.model, w.seed, w.global_batch, w.size_bytes, w.rank_rng, dict(w.options)) == (
        "mlp", 0, 16, 64 * 1024, "same", {})
    assert w.checkpoint_steps == (1, 2, 3)
    assert (case.expect.outcome, case.expect.error, case.expect.fallback_ok) == (Outcome.RECOVERS, None, False)
    assert case.expect.verdict is VerdictKind.RECOVERED
    assert case.known_issue is None
    assert (case.strategy.name, dict(case.strategy.options)) == ("torch.rank0", {})


def test_trigger_defaults():
    """Kill: phase save, first point (start), every file; after_bytes alone implies point write."""
    trigger = load(variant({"fault": {"kind": "kill", "rank": 1, "step": 4}})).cases[0].fault.trigger
    assert (trigger.rank, trigger.step, trigger.phase, trigger.point, trigger.file, trigger.after_bytes) == (
        1, 4, "save", "start", "*", None)
    trigger = load(variant({"fault": {"kind": "kill", "rank": 0, "step": 8, "after_bytes": "4KiB"}})
                   ).cases[0].fault.trigger
    assert (trigger.point, trigger.after_bytes) == ("write", 4096)


def test_disk_full_defaults_to_quota():
    fault = load(variant({"fault": {"kind": "disk_full", "rank": 0, "step": 8, "after_bytes": 0}})).cases[0].fault
    assert fault.params == {"via": "quota", "on": "checkpoint"}
    assert (fault.trigger.point, fault.trigger.after_bytes) == ("write", 0)


def test_fault_short_form_and_train_phase():
    """`fault: none` is short for `{kind: none}`; a train fault may fire at any step."""
    assert load(variant({"fault": "none"})).cases[0].fault.kind == "none"
    trigger = load(variant({"fault": {"kind": "kill", "rank": 1, "step": 7, "phase": "train"}})
                   ).cases[0].fault.trigger
    assert (trigger.phase, trigger.step, trigger.point) == ("train", 7, "start")


@pytest.mark.parametrize("rank_map,expected", [("identity", (0, 1, 2, 3)), ("reverse", (3, 2, 1, 0)),
                                               ([2, 0, 3, 1], (2, 0, 3, 1))])
def test_rank_maps(rank_map, expected):
    doc = variant({"workload.world_size": 4, "restart": {"world_size": 4, "rank_map": rank_map}})
    assert load(doc).cases[0].restart.rank_map == expected


def test_restart_to_another_world_size_uses_identity():
    restart = load(variant({"restart": {"world_size": 4}})).cases[0].restart
    assert (restart.world_size, restart.rank_map) == (4, (0, 1, 2, 3))


def test_explicit_values():
    doc = variant({"tier": "smoke", "timeouts": {"collective": 5, "phase": 7.5},
                   "workload.size": "1 MiB", "workload.global_batch": 8,
                   "workload.options": {"ema": 0.5, "accumulation": 2},
                   "expect": {"outcome": "fails_loudly", "error": "No space", "fallback_ok": True},
                   "known_issue": {"reason": "r", "link": "https://x", "verdict": "SILENT"}})
    case = load(doc).cases[0]
    assert case.tier == "smoke"
    assert (case.timeouts.collective_s, case.timeouts.phase_s) == (5.0, 7.5)
    assert (case.workload.size_bytes, case.workload.global_batch) == (1 << 20, 8)
    assert case.workload.options == {"ema": 0.5, "accumulation": 2}
    assert (case.expect.error, case.expect.fallback_ok, case.expect.verdict) == ("No space", True, VerdictKind.LOUD)
    assert case.known_issue.verdict is VerdictKind.SILENT
    assert json_round_trip(case) == case


def test_import_path_strategy_with_options():
    """A strategy given as `package.module:Class` loads, and its declared options are accepted."""
    name = f"{__name__}:OptionStrategy"
    case = load(variant({"strategy": {"name": name, "options": {"keep": 2}}})).cases[0]
    assert (case.strategy.name, dict(case.strategy.options)) == (name, {"keep": 2})
    assert json_round_trip(case) == case

    # An unquoted date is a datetime.date in YAML: it cannot travel to the ranks as JSON.
    text = dump(variant({"strategy": {"name": name, "options": {"keep": 0}}})).replace("keep: 0", "keep: 2001-01-01")
    err = scenario_error(text)
    assert err.key == "strategy.options"
    assert "JSON values" in str(err)


def test_builtin_import_path_strategy():
    case = load(variant({"strategy": "resilience.strategies.noop:NoCheckpoint"})).cases[0]
    assert case.strategy.name == "resilience.strategies.noop:NoCheckpoint"


def test_round_trip_of_matrix_cases():
    """The worker re-parses `case.document` (via JSON) and must get the very case the harness judged."""
    doc = variant({"workload.world_size": 4, "fault": "kill",
                   "matrix": {"strategy": ["torch.rank0", {"name": "torch.per_rank"}],
                              "fault.rank": [1, 3], "fault.step": [4, 12]}})
    cases = load(doc).cases
    assert len(cases) == 8
    for case in cases:
        assert "matrix" not in case.document
        assert parse_case(case.document, case.source, case.id) == case
        assert json_round_trip(case) == case


@pytest.mark.parametrize("text,expected", [
    (0, 0), (1024, 1024), ("64KiB", 64 << 10), ("512 MiB", 512 << 20), ("1GiB", 1 << 30), (" 1 gib ", 1 << 30),
    ("7", 7), ("7B", 7), ("1kb", 1000), ("2MB", 2 * 10**6), ("3 GB", 3 * 10**9),
    ("1.5MiB", None), ("-1", None), (-1, None), (True, None), (None, None), (1.5, None), ([], None),
    ("KiB", None), ("1 TiB", None), ("1e3", None), ("", None), ("1" * 5000, None),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_is_scenario_file():
    assert is_scenario_file("a/b.scenario.yaml") and is_scenario_file(Path("x.scenario.yml"))
    assert not is_scenario_file("a/b.yaml") and not is_scenario_file("scenario.yaml.bak")


# ---------------------------------------------------------------------------------------------------
# Property tests: whatever the input, only ScenarioError escapes
# ---------------------------------------------------------------------------------------------------

KEY_NAMES = ["name", "description", "strategy", "workload", "fault", "restart", "expect", "known_issue",
             "timeouts", "tier", "matrix", "model", "world_size", "steps", "checkpoint_every", "seed",
             "global_batch", "size", "rank_rng", "options", "kind", "rank", "step", "phase", "point", "file",
             "after_bytes", "via", "rank_map", "outcome", "error", "fallback_ok", "reason", "link", "verdict",
             "collective", "fault.rank", "workload.world_size", "strategy.name", "matrix.x", "fault..rank"]
WORDS = ["torch.rank0", "torch.per_rank", "none", "kill", "disk_full", "mlp", "recovers", "fails_loudly",
         "save", "train", "start", "write", "close", "identity", "reverse", "64KiB", "1GiB", "quota", "tmpfs",
         "SILENT", "RECOVERED", "smoke", "full", "same", "distinct", "*", "(", "no.such:Thing", "2001-13-45"]

scalars = (st.none() | st.booleans() | st.integers() | st.integers(-3, 20)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | st.sampled_from(WORDS))
keys = st.sampled_from(KEY_NAMES) | st.text(max_size=8) | st.integers(-2, 5)
documents = st.recursive(scalars, lambda children: st.lists(children, max_size=4)
                         | st.dictionaries(keys, children, max_size=6), max_leaves=30)
top_documents = st.dictionaries(st.sampled_from(KEY_NAMES[:11]) | keys, documents, max_size=9)
key_paths = st.sampled_from([
    "name", "description", "strategy", "strategy.name", "strategy.options", "tier", "workload",
    "workload.world_size", "workload.steps", "workload.checkpoint_every", "workload.seed", "workload.global_batch",
    "workload.size", "workload.rank_rng", "workload.options", "workload.model", "fault", "fault.kind",
    "fault.rank", "fault.step", "fault.phase", "fault.point", "fault.file", "fault.after_bytes", "fault.via",
    "restart", "restart.world_size", "restart.rank_map", "expect", "expect.outcome", "expect.error",
    "expect.fallback_ok", "known_issue", "known_issue.verdict", "known_issue.reason", "timeouts",
    "timeouts.phase", "timeouts.collective", "matrix"])
PROPERTY = settings(max_examples=300, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def check_only_scenario_errors(load_call) -> None:
    """Run a load: a Scenario whose cases survive the worker round trip, or a ScenarioError."""
    try:
        scenario = load_call()
    except ScenarioError as err:
        assert str(err).startswith(f"{SOURCE}: ")
        return
    assert isinstance(scenario, Scenario) and scenario.cases
    for case in scenario.cases:
        assert json_round_trip(case) == case


@PROPERTY
@given(top_documents | documents)
def test_random_documents_raise_only_scenario_errors(document):
    check_only_scenario_errors(lambda: load_document(document, SOURCE))


@PROPERTY
@given(st.dictionaries(key_paths, documents, min_size=1, max_size=4),
       st.sets(key_paths, max_size=2))
def test_mutated_valid_documents_raise_only_scenario_errors(changes, dropped):
    """Near-valid documents reach the deep checks that random ones rarely get past."""
    base = variant({"matrix": {"strategy": ["torch.rank0", "torch.per_rank"]}})
    doc = variant({**changes, **{path: DROP for path in dropped}}, base=base)
    check_only_scenario_errors(lambda: load_document(doc, SOURCE))


yaml_fragments = st.sampled_from(
    [f"{k}: " for k in KEY_NAMES] + [f"  {k}: " for k in KEY_NAMES] + WORDS
    + ["\n", "\n  ", "- ", "{", "}", "[", "]", ", ", ": ", "&a ", "*a", "<<: ", "? ", "!!int ", "!!set ",
       "!!binary ", "!!timestamp ", "'", '"', "#", "---\n", "\t", "%YAML 1.1\n", "|\n", ">\n", "\\x00"])


@PROPERTY
@given(st.one_of(st.text(max_size=200), st.lists(yaml_fragments | st.text(max_size=5), max_size=40).map("".join),
                 top_documents.map(lambda d: yaml.safe_dump(d, allow_unicode=True))))
def test_random_text_raises_only_scenario_errors(text):
    check_only_scenario_errors(lambda: load_text(text, SOURCE))


@PROPERTY
@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none(), st.booleans()))
def test_parse_size_never_raises(value):
    size = parse_size(value)
    assert size is None or (isinstance(size, int) and size >= 0)


def test_case_ids_leave_expectations_out_unless_they_alone_tell_cases_apart():
    """Ids name what varies in the case; an expectation joins the id only when needed to be unique."""
    doc = variant({"matrix": [{"strategy": "torch.rank0", "expect": "fails_loudly"},
                              {"strategy": "torch.per_rank"}]})
    assert [c.id for c in load(doc).cases] == ["strategy=torch.rank0", "strategy=torch.per_rank"]
    doc = variant({"matrix": [{"strategy": "torch.rank0", "expect": "fails_loudly"},
                              {"strategy": "torch.rank0", "expect": "recovers"}]})
    assert [c.id for c in load(doc).cases] == ["strategy=torch.rank0,expect=fails_loudly",
                                               "strategy=torch.rank0,expect=recovers"]


def test_a_plain_on_key_is_the_word_not_a_yaml_bool():
    """YAML 1.1 reads a plain `on:` key as True; `disk_full on: staging` must mean what it says,
    while `true`/`false` and values stay YAML's."""
    text = ("name: n\nstrategy: torch.per_rank\n"
            "workload: {model: mlp, world_size: 2, steps: 8, checkpoint_every: 4}\n"
            "fault: {kind: disk_full, rank: 0, step: 4, phase: save, point: write, on: staging, after_bytes: 10}\n"
            "expect: fails_loudly\n")
    (case,) = load_text(text, SOURCE).cases
    assert case.fault.params["on"] == "staging"
    bad = text.replace("on: staging", "on: nowhere")
    with pytest.raises(ScenarioError, match="fault.on"):
        load_text(bad, SOURCE)


# ---------------------------------------------------------------------------------------------------
# One option validator for a strategy and a wrapper's inner strategy; capabilities against the fault
# ---------------------------------------------------------------------------------------------------

MANIFEST_OVER_PER_RANK = ("name: manifest over staggered per-rank saves\n"
                          "strategy: {name: manifest, options: {inner: torch.per_rank, inner_options: {stagger: %s}}}\n"
                          "workload: {model: mlp, world_size: 2, steps: 12, checkpoint_every: 4}\n"
                          "fault: {kind: kill, rank: 0, step: 8, point: start}\n"
                          "expect: recovers\n")


def test_a_wrapped_strategys_count_option_is_accepted(tmp_path):
    """``stagger`` is a count (``option_values`` says ``int``): the manifest validates its inner's
    options with the validator the scenario's own strategy gets."""
    path = tmp_path / "manifest.scenario.yaml"
    path.write_text(MANIFEST_OVER_PER_RANK % 2)
    (case,) = load_file(path).cases
    assert case.strategy.options == {"inner": "torch.per_rank", "inner_options": {"stagger": 2}}


@pytest.mark.parametrize("value,problem", [(0, "out of range"), ("two", "must be an integer"),
                                           ("true", "must be an integer")])
def test_a_wrapped_strategys_bad_count_is_one_scenario_error_naming_its_key(tmp_path, value, problem):
    path = tmp_path / "manifest.scenario.yaml"
    path.write_text(MANIFEST_OVER_PER_RANK % value)
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    err = info.value
    assert len(err.problems) == 1 and err.path == str(path)
    assert err.key == "strategy.options.inner_options.stagger" and problem in str(err)
    assert str(err).startswith(f"{path}: strategy.options.inner_options.stagger: ") and err.allowed == "1..64"
    # the scenario's own strategy gets the very same answer
    direct = scenario_error(variant({"strategy": {"name": "torch.per_rank", "options": {"stagger": yaml.safe_load(
        str(value))}}}))
    assert (direct.key, direct.problem, direct.allowed) == ("strategy.options.stagger", err.problem, err.allowed)


def test_a_fault_needing_a_capability_the_strategy_lacks_is_refused_at_load():
    err = scenario_error(variant({"strategy": "torch.per_rank", "fault": {"kind": "tag_mismatch", "rank": 1,
                                                                          "step": 4}}))
    assert err.key == "strategy" and err.value == "torch.per_rank" and "tag_for()" in err.problem
    assert err.allowed == "deepspeed.zero1, deepspeed.zero2, deepspeed.zero3, megatron_deepspeed"
    # a wrapper offers what its inner offers (and forwards)
    load(variant({"strategy": {"name": "manifest", "options": {"inner": "deepspeed.zero2"}},
                  "fault": {"kind": "tag_mismatch", "rank": 1, "step": 4}}))
    # and options may turn a capability off: DCP has saves in flight in async mode only
    overlapping = {"kind": "overlapping_async", "rank": 1, "step": 4}
    err = scenario_error(variant({"strategy": {"name": "dcp", "options": {"mode": "sync"}}, "fault": overlapping}))
    assert err.key == "strategy" and "only with other options" in err.problem and err.allowed == "dcp"
    load(variant({"strategy": {"name": "dcp", "options": {"mode": "async"}}, "fault": overlapping}))


def test_a_strategy_class_declares_exactly_the_capabilities_it_implements():
    from resilience.core.capabilities import Capability

    with pytest.raises(TypeError, match="declares Capability.TAGS but does not override tag_for"):
        type("Declares", (OptionStrategy,), {"capabilities": frozenset({Capability.TAGS})})
    with pytest.raises(TypeError, match="overrides tag_for without declaring Capability.TAGS"):
        type("Undeclared", (OptionStrategy,), {"tag_for": lambda self, step: str(step)})
    with pytest.raises(TypeError, match="does not override step_location"):  # CHOSEN_STEP is both methods
        type("HalfChosen", (OptionStrategy,), {"capabilities": frozenset({Capability.CHOSEN_STEP}),
                                               "load_step": lambda self, workload, step: None})
    with pytest.raises(TypeError, match="records_version"):
        type("OldStyle", (OptionStrategy,), {"records_version": True})
    tags = type("Tags", (OptionStrategy,), {"capabilities": frozenset({Capability.TAGS}),
                                            "tag_for": lambda self, step: f"global_step{step}"})
    assert tags.capabilities_for({}) == {Capability.TAGS} and OptionStrategy.capabilities_for({}) == frozenset()
