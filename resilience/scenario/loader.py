"""YAML scenario files -> validated, matrix-expanded `Scenario`s.

Every problem becomes a `ScenarioError` naming the file, the key path, the bad value and what is
allowed; nothing else escapes from here.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from ..core import registry
from ..core.confined import RELATIVE_GLOB, relative_glob_problem
from ..errors import PluginError, ScenarioError
from ..core.case import (Case, Expect, FaultSpec, KnownIssue, Outcome, RestartSpec, Scenario, StrategySpec,
                         Timeouts, Trigger, VerdictKind, WorkloadSpec)
from ..core.topology import SHARED, STORAGE_KINDS, Topology

TOP_KEYS = ("name", "description", "strategy", "workload", "fault", "restart", "expect",
            "known_issue", "timeouts", "tier", "matrix", "topology")
WORKLOAD_KEYS = ("model", "world_size", "steps", "checkpoint_every", "seed", "global_batch", "size",
                 "rank_rng", "options")
TRIGGER_KEYS = ("rank", "step", "phase", "point", "file", "after_bytes")
RESTART_KEYS = ("world_size", "rank_map", "python", "packages", "topology")
TOPOLOGY_KEYS = ("tp", "pp", "nodes", "node_ids", "storage")
REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?(\s*(==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+)*$")
EXPECT_KEYS = ("outcome", "error", "fallback_ok")
KNOWN_ISSUE_KEYS = ("reason", "link", "verdict")
TIMEOUT_KEYS = ("collective", "phase")
TIERS = ("smoke", "full")
RANK_RNG = ("same", "distinct")
MAX_WORLD_SIZE = 64
SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
SIZE_PATTERN = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
DEFAULT_TIMEOUTS = {"collective": 60.0, "phase": 180.0}
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week; far longer overflows the process group's timedelta
# A scenario is a few KiB (the largest shipped one is about 5 KiB, 350 nodes deep 7). Beyond these, a
# file is refused before anything expands it: aliases make a small file a huge document (billion
# laughs), and the matrix multiplies it into cases.
MAX_FILE_BYTES = 128 << 10
MAX_NODES = 20_000  # YAML nodes, every alias counted as the whole value it repeats
MAX_DEPTH = 40
MAX_CASES = 1_000
SHORT_FORMS = {"strategy": "name", "expect": "outcome", "fault": "kind"}  # `strategy: x` = `strategy: {name: x}`


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that rejects duplicate keys instead of keeping the last one silently."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as exc:  # e.g. `2001-13-45` or `!!int x`: PyYAML raises ValueError & co. without a mark
            value = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            raise yaml.constructor.ConstructorError(
                None, None, f"invalid value {str(value)[:40]!r}: {type(exc).__name__}: {str(exc)[:200]}",
                node.start_mark) from None


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor` merge keys: SafeLoader.construct_mapping flattens them
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a scalar, not a {type(key).__name__}", key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_file(path: Path | str) -> Scenario:
    path = Path(path)
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)  # no more than that: /dev/zero ends here too
        _check_length(len(data), str(path))
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(path), "", f"cannot read the file: {exc}") from None
    return load_text(text, str(path))


def _check_length(length: int, source: str) -> None:
    if length > MAX_FILE_BYTES:
        raise ScenarioError(source, "", f"larger than {MAX_FILE_BYTES >> 10} KiB; a scenario is a few KiB")


def load_text(text: str, source: str) -> Scenario:
    _check_length(len(text), source)
    try:
        document = _safe_load(text, source)
    except ScenarioError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(source, "", f"YAML syntax error{where}: {problem}") from None
    except RecursionError:
        raise ScenarioError(source, "", "YAML nesting too deep") from None
    except Exception as exc:  # PyYAML's constructors raise ValueError & co. for e.g. `2001-13-45`, `!!int x`
        raise ScenarioError(source, "", f"invalid YAML value: {type(exc).__name__}: {exc}") from None
    return load_document(document, source)


def _safe_load(text: str, source: str) -> Any:
    """Safe YAML (no tags that build objects), refused when it expands past MAX_NODES or MAX_DEPTH."""
    loader = _StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        problem = _size_problem(root)
        if problem:
            raise ScenarioError(source, "", problem)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _size_problem(root: yaml.Node) -> str | None:
    """Walks the node graph as the document will be (aliases expanded), stopping at the limits."""
    pending, count = [(root, 1)], 0
    while pending:
        node, depth = pending.pop()
        count += 1
        if count > MAX_NODES:
            return f"the document expands to more than {MAX_NODES} values (aliases count once per use)"
        if depth > MAX_DEPTH:
            return f"the document nests deeper than {MAX_DEPTH} levels"
        if isinstance(node, yaml.SequenceNode):
            pending.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            pending.extend((child, depth + 1) for pair in node.value for child in pair)
    return None


def load_document(document: Any, source: str) -> Scenario:
    doc = _mapping(source, "", document, TOP_KEYS)
    matrix = doc.pop("matrix", None)
    cases = []
    for case_id, overrides in _expand_matrix(source, matrix):
        case_doc = copy.deepcopy(doc)
        for key_path, value in overrides:
            _set_path(source, case_doc, key_path, value)
        where = f" (matrix case {case_id})" if case_id else ""
        cases.append(parse_case(case_doc, source, case_id, where))
    name = cases[0].name
    return Scenario(path=source, name=name, cases=tuple(cases))


def read_case_file(path: Path) -> Case:
    """The case the harness handed to its rank processes (case.json of the case directory)."""
    data = json.loads(Path(path).read_text())
    return parse_case(data["document"], data["source"], data["id"])


def parse_case(document: Any, source: str, case_id: str = "", where: str = "") -> Case:
    """Validate one case document (a scenario without `matrix`). Workers re-parse what the harness sends."""
    v = _Validator(source, where)
    doc = v.mapping("", document, TOP_KEYS)
    if "matrix" in doc:
        raise v.error("matrix", "a case document cannot carry a matrix", doc["matrix"])
    name = v.string("name", doc.get("name"))
    description = v.string("description", doc.get("description"))
    tier = v.choice("tier", doc.get("tier", "full"), TIERS)
    strategy = v.strategy(doc.get("strategy"))
    workload = v.workload(doc.get("workload"))
    model_parallel = registry.resolve("workload", workload.model).model_parallel
    topology = v.topology("topology", doc.get("topology", {} if model_parallel else None), workload.world_size,
                          workload)
    fault = v.fault(doc.get("fault", {"kind": "none"}), workload)
    restart = v.restart(doc.get("restart", {}), workload, topology)
    problem = registry.resolve("fault", fault.kind).check_strategy(registry.resolve("strategy", strategy.name))
    if problem:
        raise v.error(*problem)
    expect = v.expect(doc.get("expect"))
    known_issue = v.known_issue(doc.get("known_issue"), expect)
    timeouts = v.timeouts(doc.get("timeouts", {}))
    return Case(id=case_id or "case", source=source, name=name, description=description, tier=tier,
                strategy=strategy, workload=workload, fault=fault, restart=restart, expect=expect,
                known_issue=known_issue, timeouts=timeouts, document=doc, topology=topology)


def parse_size(text: Any) -> int | None:
    """Bytes from an int or a string like '64KiB', '512 MiB', '1GiB'; None if not a size."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text if text >= 0 else None
    if not isinstance(text, str):
        return None
    match = SIZE_PATTERN.match(text)
    if not match or match.group(2).lower() not in SIZE_UNITS:
        return None
    try:
        number = int(match.group(1))
    except ValueError:  # more digits than int() accepts (sys.get_int_max_str_digits)
        return None
    return number * SIZE_UNITS[match.group(2).lower()]


def _mapping(source: str, key: str, value: Any, allowed: tuple[str, ...]) -> dict:
    return _Validator(source, "").mapping(key, value, allowed)


def _expand_matrix(source: str, matrix: Any) -> list[tuple[str, list[tuple[str, Any]]]]:
    if matrix is None:
        return [("", [])]
    if isinstance(matrix, dict):
        if not matrix:
            raise ScenarioError(source, "matrix", "an empty matrix expands to no case", matrix,
                                "a mapping of key path -> list of values, or a list of mappings")
        axes = []
        for key_path, values in matrix.items():
            _check_key_path(source, key_path)
            if not isinstance(values, list) or not values:
                raise ScenarioError(source, f"matrix.{key_path}", "must be a non-empty list of values", values)
            axes.append([(key_path, value) for value in values])
        count = math.prod(len(axis) for axis in axes)
        if count > MAX_CASES:
            raise ScenarioError(source, "matrix", f"expands to {count} cases", None, f"at most {MAX_CASES}")
        combos = [list(combo) for combo in itertools.product(*axes)]
    elif isinstance(matrix, list):
        if not matrix:
            raise ScenarioError(source, "matrix", "an empty matrix expands to no case", matrix,
                                "a mapping of key path -> list of values, or a list of mappings")
        combos = []
        for index, entry in enumerate(matrix):
            if not isinstance(entry, dict) or not entry:
                raise ScenarioError(source, f"matrix[{index}]", "must be a non-empty mapping of key path -> value", entry)
            for key_path in entry:
                _check_key_path(source, key_path, f"matrix[{index}]")
            combos.append(list(entry.items()))
    else:
        raise ScenarioError(source, "matrix", "must be a mapping or a list", matrix,
                            "a mapping of key path -> list of values, or a list of mappings")
    ids = [_case_id(combo, full=False) for combo in combos]
    if len(set(ids)) < len(ids):  # only the expectations tell some cases apart: name them too
        ids = [_case_id(combo, full=True) for combo in combos]
    expanded, seen = [], set()
    for case_id, combo in zip(ids, combos):
        if case_id in seen:
            raise ScenarioError(source, "matrix", f"two cases have the same values ({case_id})")
        seen.add(case_id)
        expanded.append((case_id, combo))
    return expanded


OUTCOME_KEYS = ("expect", "known_issue", "name", "description")


def _case_id(combo: list[tuple[str, Any]], full: bool) -> str:
    """What varies in this case, e.g. strategy=torch.rank0,fault.rank=2 (expectations left out)."""
    items = [(k, v) for k, v in _id_items(combo) if full or k.split(".")[0] not in OUTCOME_KEYS]
    return ",".join(f"{key}={_id_value(value)}" for key, value in items)


def _id_items(combo: list[tuple[str, Any]]):
    """A mapping value reads as its dotted leaves: fault={kind: stall, seconds: 3} gives
    fault.kind=stall,fault.seconds=3 in the case id."""
    for key, value in combo:
        if isinstance(value, dict) and value:
            yield from _id_items([(f"{key}.{k}", v) for k, v in value.items()])
        else:
            yield key, value


def _id_value(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return re.sub(r"[^\w.-]+", "_", str(value)).strip("_") or "x"
    return re.sub(r"[^\w.*-]+", "_", str(value))  # a path's "/" would read as a test id separator


def _check_key_path(source: str, key_path: Any, where: str = "matrix") -> None:
    if not isinstance(key_path, str) or not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", key_path):
        raise ScenarioError(source, where, "keys must be dotted key paths such as fault.rank", key_path)
    if key_path.split(".")[0] not in TOP_KEYS or key_path.split(".")[0] == "matrix":
        raise ScenarioError(source, f"{where}.{key_path}", "unknown key path", key_path,
                            [k for k in TOP_KEYS if k != "matrix"])


def _set_path(source: str, doc: dict, key_path: str, value: Any) -> None:
    parts = key_path.split(".")
    node = doc
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif isinstance(child, str) and depth == 0 and part in SHORT_FORMS:
            child = node[part] = {SHORT_FORMS[part]: child}
        if not isinstance(child, dict):
            raise ScenarioError(source, f"matrix.{key_path}", f"{'.'.join(parts[:depth + 1])} is not a mapping", child)
        node = child
    node[parts[-1]] = copy.deepcopy(value)


class _Validator:
    """Checks one case document; every error names the key path."""

    def __init__(self, source: str, where: str):
        self.source, self.where = source, where

    def error(self, key: str, problem: str, value: Any = None, allowed: Any = None) -> ScenarioError:
        return ScenarioError(self.source, key + self.where, problem, value, allowed)

    # -- primitives -------------------------------------------------------------------------------
    def mapping(self, key: str, value: Any, allowed: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            raise self.error(key, "must be a mapping", value, allowed)
        for k in value:
            if k not in allowed:
                raise self.error(_join(key, str(k)), "unknown key", k, allowed)
        return dict(value)

    def required(self, key: str, value: Any, allowed: Any = None) -> Any:
        if value is None:
            raise self.error(key, "missing required key", None, allowed)
        return value

    def string(self, key: str, value: Any, allowed: Any = None) -> str:
        value = self.required(key, value, allowed)
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, "must be a non-empty string", value)
        return value

    def integer(self, key: str, value: Any, low: int, high: int | None = None, allowed: str | None = None) -> int:
        value = self.required(key, value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, "must be an integer", value, allowed or _range(low, high))
        if value < low or (high is not None and value > high):
            raise self.error(key, "out of range", value, allowed or _range(low, high))
        return value

    def number(self, key: str, value: Any, low: float, high: float = math.inf) -> float:
        allowed = f"a number > {low}" + (f" and <= {high:g}" if high < math.inf else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be a finite number > {low}", value, allowed)
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not low < number < math.inf:  # also rejects nan; timedelta(seconds=inf) fails in the ranks
            raise self.error(key, f"must be a finite number > {low}", value, allowed)
        if number > high:
            raise self.error(key, "out of range", value, allowed)
        return number

    def plain(self, key: str, value: Any) -> Any:
        """Options travel to the rank processes as JSON: they must come back from it unchanged."""
        try:
            same = json.loads(json.dumps(value)) == value
        except (TypeError, ValueError, RecursionError):
            same = False
        if not same:
            raise self.error(key, "must hold only JSON values (strings, numbers, booleans, null, lists, "
                                  "mappings with string keys)", value)
        return value

    def relative_glob(self, key: str, value: Any) -> str:
        """A pattern of files under the checkpoint directory: never a way out of it."""
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, "must be a non-empty string", value, RELATIVE_GLOB)
        problem = relative_glob_problem(value)
        if problem:
            raise self.error(key, f"must stay inside the checkpoint directory; this pattern {problem}", value,
                             RELATIVE_GLOB)
        return value

    def choice(self, key: str, value: Any, allowed: tuple[str, ...]) -> str:
        value = self.required(key, value, allowed)
        if value not in allowed:
            raise self.error(key, "not one of the allowed values", value, allowed)
        return value

    def boolean(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, "must be true or false", value)
        return value

    def plugin(self, kind: str, key: str, name: Any) -> type:
        allowed = list(registry.TABLES[kind]) + ["package.module:Class"]
        name = self.string(key, name, allowed)
        try:
            return registry.resolve(kind, name)
        except PluginError as exc:
            raise self.error(key, str(exc), name, allowed) from None
        except Exception as exc:  # the module exists but raised while being imported
            raise self.error(key, f"importing {kind} {name!r} raised {type(exc).__name__}: {exc}",
                             name, allowed) from exc

    # -- sections ---------------------------------------------------------------------------------
    def strategy(self, value: Any) -> StrategySpec:
        if isinstance(value, dict):
            doc = self.mapping("strategy", value, ("name", "options"))
            name, options = doc.get("name"), doc.get("options", {})
            key = "strategy.name"
        else:
            name, options, key = value, {}, "strategy"
        cls = self.plugin("strategy", key, name)
        options = self.plain("strategy.options", self.mapping("strategy.options", options, tuple(cls.options)))
        for option, allowed in cls.option_values.items():
            if option in options and allowed is int:  # a count, such as ranks per write wave
                self.integer(f"strategy.options.{option}", options[option], 1, MAX_WORLD_SIZE)
            elif option in options:
                self.choice(f"strategy.options.{option}", options[option], allowed)
        check_options = getattr(cls, "check_options", None)
        problem = check_options(options) if check_options else None
        if problem:
            raise self.error(*problem)
        return StrategySpec(name=name, options=options)

    def workload(self, value: Any) -> WorkloadSpec:
        doc = self.mapping("workload", self.required("workload", value), WORKLOAD_KEYS)
        model = doc.get("model", "mlp")
        model_parallel = self.plugin("workload", "workload.model", model).model_parallel
        world_size = self.integer("workload.world_size", doc.get("world_size"), 1, MAX_WORLD_SIZE)
        steps = self.integer("workload.steps", doc.get("steps"), 1, 100_000)
        every = self.integer("workload.checkpoint_every", doc.get("checkpoint_every"), 1, steps,
                             f"1..steps ({steps})")
        seed = self.integer("workload.seed", doc.get("seed", 0), 0, 2**31 - 1)
        global_batch = self.integer("workload.global_batch", doc.get("global_batch", 16), 1, 1 << 20)
        if global_batch % world_size and not model_parallel:  # model-parallel: the topology checks dp
            raise self.error("workload.global_batch", f"must be divisible by workload.world_size ({world_size})",
                             global_batch, "a multiple of the world size")
        size = parse_size(doc.get("size", "64KiB"))
        if size is None or size < 1024:
            raise self.error("workload.size", "must be a parameter size of at least 1KiB", doc.get("size"),
                             "bytes as an integer, or a number with KiB, MiB, GiB (KB, MB, GB)")
        rank_rng = self.choice("workload.rank_rng", doc.get("rank_rng", "same"), RANK_RNG)
        options = doc.get("options", {})
        options = self.plain("workload.options", self.mapping(
            "workload.options", options, tuple(options) if isinstance(options, dict) else ()))
        return WorkloadSpec(model=model, world_size=world_size, steps=steps, checkpoint_every=every, seed=seed,
                            global_batch=global_batch, size_bytes=size, rank_rng=rank_rng, options=options)

    def fault(self, value: Any, workload: WorkloadSpec) -> FaultSpec:
        if isinstance(value, str):
            value = {"kind": value}
        if not isinstance(value, dict):
            raise self.error("fault", "must be a mapping with a kind", value, list(registry.FAULTS))
        cls = self.plugin("fault", "fault.kind", value.get("kind"))
        param_keys = tuple(cls.params)
        doc = self.mapping("fault", value, ("kind",) + (TRIGGER_KEYS if cls.needs_trigger else ()) + param_keys)
        params = {}
        for key, (allowed, default) in cls.params.items():
            if allowed is float:
                value = self.required(f"fault.{key}", doc.get(key, default))
                params[key] = self.number(f"fault.{key}", value, 0)
            elif allowed is object:  # any JSON value or absent (None); the fault's check() validates it
                params[key] = self.plain(f"fault.{key}", doc.get(key, default))
            elif allowed is str:  # an optional glob or name, of files under the checkpoint directory
                value = doc.get(key, default)
                params[key] = value if value is None else self.relative_glob(f"fault.{key}", value)
            else:
                params[key] = self.choice(f"fault.{key}", doc.get(key, default), allowed)
        trigger = self.trigger(doc, workload, cls) if cls.needs_trigger else None
        spec = FaultSpec(kind=doc["kind"], trigger=trigger, params=params)
        problem = cls.check(spec)
        if problem:
            raise self.error(*problem)
        return spec

    def trigger(self, doc: dict, workload: WorkloadSpec, cls: type) -> Trigger:
        if cls.needs_rank:
            rank = self.integer("fault.rank", doc.get("rank"), 0, workload.world_size - 1,
                                f"0..{workload.world_size - 1} (workload.world_size is {workload.world_size})")
        elif "rank" in doc:
            raise self.error("fault.rank", f"a {cls.kind} fault hits every rank at once; leave rank out", doc["rank"])
        else:
            rank = 0
        phase = self.choice("fault.phase", doc.get("phase", "save"), tuple(cls.points))
        step = self.integer("fault.step", doc.get("step"), 1, workload.steps, f"1..{workload.steps}")
        if phase == "save" and step not in workload.checkpoint_steps:
            raise self.error("fault.step", "no checkpoint is saved at this step", step,
                             ", ".join(map(str, workload.checkpoint_steps)))
        after_bytes = doc.get("after_bytes")
        if after_bytes is not None:
            after_bytes = parse_size(after_bytes)
            if after_bytes is None:
                raise self.error("fault.after_bytes", "must be a byte offset", doc.get("after_bytes"),
                                 "an integer >= 0 or a size such as 4KiB")
        default_point = ("write" if after_bytes is not None and "write" in cls.points[phase]
                         else cls.points[phase][0])
        point = self.choice("fault.point", doc.get("point", default_point), cls.points[phase])
        if point == "write" and after_bytes is None and "write" in cls.byte_points:
            raise self.error("fault.after_bytes", "missing: point 'write' needs a byte offset")
        if after_bytes is not None and point not in cls.byte_points:
            raise self.error("fault.after_bytes", f"has no meaning at point {point!r}", after_bytes,
                             f"points {', '.join(cls.byte_points)}")
        file = self.relative_glob("fault.file", doc.get("file", "*"))
        return Trigger(rank=rank, step=step, phase=phase, point=point, file=file, after_bytes=after_bytes)

    def topology(self, key: str, value: Any, world_size: int, workload: WorkloadSpec,
                 storage: str | None = None) -> Topology | None:
        """TP x PP x DP and node placement of ``world_size`` ranks; ``storage`` given: a restart's
        topology, which keeps the first run's storage (the cluster's, not the job's)."""
        if value is None:
            return None
        allowed = TOPOLOGY_KEYS if storage is None else TOPOLOGY_KEYS[:-1]
        doc = self.mapping(key, value, allowed)
        tp = self.integer(f"{key}.tp", doc.get("tp", 1), 1, world_size)
        pp = self.integer(f"{key}.pp", doc.get("pp", 1), 1, world_size)
        if world_size % (tp * pp):
            raise self.error(f"{key}.tp", f"tp x pp ({tp} x {pp}) must divide the world size ({world_size})", tp,
                             [t for t in range(1, world_size + 1) if world_size % (t * pp) == 0])
        dp = world_size // (tp * pp)
        cls = registry.resolve("workload", workload.model)
        if (tp, pp) != (1, 1) and not cls.model_parallel:
            raise self.error(f"{key}.tp", f"workload {workload.model!r} has no tensor or pipeline parallelism",
                             {"tp": tp, "pp": pp}, "tp: 1, pp: 1, or a model-parallel workload such as tp_mlp")
        if workload.global_batch % dp:
            raise self.error(f"{key}.tp", f"the data-parallel degree {dp} must divide workload.global_batch "
                                          f"({workload.global_batch})", tp)
        if cls.model_parallel:
            problem = cls.topology_problem(workload, tp, pp)
            if problem:
                raise self.error(f"{key}.tp", problem, {"tp": tp, "pp": pp})
        nodes = self.integer(f"{key}.nodes", doc.get("nodes", 1), 1, world_size,
                             f"a divisor of the world size ({world_size})")
        if world_size % nodes:
            raise self.error(f"{key}.nodes", f"must divide the world size ({world_size}): ranks fill nodes "
                                             "in equal blocks", nodes,
                             [n for n in range(1, world_size + 1) if world_size % n == 0])
        node_ids = doc.get("node_ids", list(range(nodes)))
        if (not isinstance(node_ids, list) or len(node_ids) != nodes
                or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1024 for n in node_ids)
                or len(set(node_ids)) != nodes):
            raise self.error(f"{key}.node_ids", f"must list {nodes} distinct physical node numbers, one per "
                                                "block of ranks", node_ids, f"e.g. {list(reversed(range(nodes)))}")
        if storage is None:
            storage = self.choice(f"{key}.storage", doc.get("storage", SHARED), STORAGE_KINDS)
        return Topology(tp=tp, pp=pp, dp=dp, node_ids=tuple(node_ids), storage=storage)

    def restart(self, value: Any, workload: WorkloadSpec, topology: Topology | None = None) -> RestartSpec:
        doc = self.mapping("restart", value if value is not None else {}, RESTART_KEYS)
        world_size = self.integer("restart.world_size", doc.get("world_size", workload.world_size), 1, MAX_WORLD_SIZE)
        if workload.global_batch % world_size and not registry.resolve("workload", workload.model).model_parallel:
            raise self.error("restart.world_size", f"must divide workload.global_batch ({workload.global_batch})",
                             world_size, [w for w in range(1, MAX_WORLD_SIZE + 1) if workload.global_batch % w == 0])
        rank_map = doc.get("rank_map", "identity")
        if rank_map == "identity":
            mapping = tuple(range(world_size))
        elif rank_map == "reverse":
            mapping = tuple(reversed(range(world_size)))
        elif isinstance(rank_map, list) and all(
                isinstance(r, int) and not isinstance(r, bool) for r in rank_map) and sorted(rank_map) == list(
                range(world_size)):
            mapping = tuple(rank_map)
        else:
            raise self.error("restart.rank_map", "must be identity, reverse, or a permutation of the restart's ranks",
                             rank_map, f"identity, reverse, a list holding each of 0..{world_size - 1} once")
        if world_size != workload.world_size and mapping != tuple(range(world_size)):
            raise self.error("restart.rank_map", "a permuted rank map needs the same world size at restart",
                             rank_map, "identity")
        python, packages = doc.get("python"), doc.get("packages", [])
        if python is not None and (not isinstance(python, str) or not python.strip() or "\0" in python):
            raise self.error("restart.python", "must be the path of a Python interpreter", python,
                             "a path such as /opt/venv-old/bin/python")
        if not isinstance(packages, list) or not all(isinstance(r, str) and REQUIREMENT.match(r) for r in packages):
            raise self.error("restart.packages", "must be a list of pip requirements", packages,
                             "e.g. [deepspeed==0.17.6]")
        if python is not None and packages:
            raise self.error("restart.packages", "give python or packages, not both", packages,
                             "packages layered over this environment, or another interpreter")
        first = topology or Topology.single_node(workload.world_size)
        restart_topology = self.topology("restart.topology", doc.get("topology"), world_size, workload,
                                         storage=first.storage)
        if restart_topology is None and topology is not None:  # the job comes back as it was placed
            if world_size % first.nodes == 0 and world_size % (first.tp * first.pp) == 0:
                restart_topology = Topology(tp=first.tp, pp=first.pp, dp=world_size // (first.tp * first.pp),
                                            node_ids=first.node_ids, storage=first.storage)
            else:
                raise self.error("restart.topology", f"missing: the first run's topology ({first.describe()}) "
                                                     f"cannot hold {world_size} ranks", None, TOPOLOGY_KEYS[:-1])
        return RestartSpec(world_size=world_size, rank_map=mapping, python=python, packages=tuple(packages),
                           topology=restart_topology)

    def expect(self, value: Any) -> Expect:
        allowed = [o.value for o in Outcome]
        doc = {"outcome": value} if isinstance(value, str) or value is None else value
        doc = self.mapping("expect", doc, EXPECT_KEYS)
        outcome = Outcome(self.choice("expect.outcome" if isinstance(value, dict) else "expect",
                                      doc.get("outcome"), tuple(allowed)))
        error = doc.get("error")
        if error is not None:
            if outcome is not Outcome.FAILS_LOUDLY:
                raise self.error("expect.error", "an error pattern needs outcome fails_loudly", error)
            if not isinstance(error, str):
                raise self.error("expect.error", "must be a regular expression string", error)
            try:
                re.compile(error)
            except re.error as exc:
                raise self.error("expect.error", f"not a valid regular expression: {exc}", error) from None
        fallback_ok = self.boolean("expect.fallback_ok", doc.get("fallback_ok", False))
        return Expect(outcome=outcome, error=error, fallback_ok=fallback_ok)

    def known_issue(self, value: Any, expect: Expect) -> KnownIssue | None:
        if value is None:
            return None
        doc = self.mapping("known_issue", value, KNOWN_ISSUE_KEYS)
        verdicts = tuple(v.value for v in VerdictKind)
        verdict = VerdictKind(self.choice("known_issue.verdict", doc.get("verdict"), verdicts))
        if verdict is expect.verdict:
            raise self.error("known_issue.verdict", "must differ from the expected verdict", verdict.value,
                             [v for v in verdicts if v != expect.verdict.value])
        return KnownIssue(reason=self.string("known_issue.reason", doc.get("reason")),
                          link=self.string("known_issue.link", doc.get("link")), verdict=verdict)

    def timeouts(self, value: Any) -> Timeouts:
        doc = self.mapping("timeouts", value, TIMEOUT_KEYS)
        merged = {**DEFAULT_TIMEOUTS, **doc}
        collective = self.number("timeouts.collective", merged["collective"], 0, MAX_TIMEOUT_S)
        phase = self.number("timeouts.phase", merged["phase"], 0, MAX_TIMEOUT_S)
        return Timeouts(collective_s=collective, phase_s=phase)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _range(low: int, high: int | None) -> str:
    return f"{low}..{high}" if high is not None else f">= {low}"

