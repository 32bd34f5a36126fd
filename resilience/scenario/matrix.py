"""A scenario's `matrix` -> one (case id, overrides) per case, and the overrides applied to a copy.

A mapping matrix is the cartesian product of its axes, a list matrix names each case. The case id
says what varies in the case, e.g. ``strategy=torch.rank0,fault.rank=2``.
"""
from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Callable
from typing import Any

from ..errors import ScenarioError
from .checks import Problems
from .schema import SHORT_FORMS, TOP_KEYS

MAX_CASES = 1_000  # the matrix multiplies a small file into cases: refused past this
MATRIX_FORMS = "a mapping of key path -> list of values, or a list of mappings"
OUTCOME_KEYS = ("expect", "known_issue", "name", "description")  # in a case id only when needed to be unique
KEY_PATH = re.compile(r"^[A-Za-z_]\w*(\.([A-Za-z_]\w*|\d+))*$")  # a digit part indexes a list

Overrides = list[tuple[str, Any]]


def expand_cases(source: str, doc: dict, top_keys: tuple[str, ...], problems: Problems,
                 check: Callable[[dict, str, str, str, Problems], Any]) -> list:
    """Each case of a checked document (its ``matrix`` applied), checked by
    ``check(case_doc, source, case_id, where, problems)``; raises every problem of every case at once."""
    try:
        expanded = expand_matrix(source, doc.pop("matrix", None), top_keys)
    except ScenarioError as exc:  # no case to check: the document's own problems and this one
        problems.add(exc)
        raise problems.error() from None
    cases = []
    for case_id, overrides in expanded:
        case_doc = copy.deepcopy(doc)
        try:
            for key_path, value in overrides:
                set_path(source, case_doc, key_path, value)
        except ScenarioError as exc:
            problems.add(exc)
            continue
        case = check(case_doc, source, case_id, f" (matrix case {case_id})" if case_id else "", problems)
        if case is not None:
            cases.append(case)
    problems.raise_any()
    return cases


def expand_matrix(source: str, matrix: Any, top_keys: tuple[str, ...] = TOP_KEYS) -> list[tuple[str, Overrides]]:
    """Each case of ``matrix`` (None: one case, no id) with the key paths it sets, in file order;
    ``top_keys``: where a key path may begin (a script scenario's keys differ)."""
    if matrix is None:
        return [("", [])]
    if isinstance(matrix, dict):
        combos = _product(source, matrix, top_keys)
    elif isinstance(matrix, list):
        combos = _listed(source, matrix, top_keys)
    else:
        raise ScenarioError(source, "matrix", "must be a mapping or a list", matrix, MATRIX_FORMS)
    ids = [case_id(combo, full=False) for combo in combos]
    if len(set(ids)) < len(ids):  # only the expectations tell some cases apart: name them too
        ids = [case_id(combo, full=True) for combo in combos]
    expanded, seen = [], set()
    for one_id, combo in zip(ids, combos, strict=True):
        if one_id in seen:
            raise ScenarioError(source, "matrix", f"two cases have the same values ({one_id})")
        seen.add(one_id)
        expanded.append((one_id, combo))
    return expanded


def _product(source: str, matrix: dict, top_keys: tuple[str, ...]) -> list[Overrides]:
    if not matrix:
        raise ScenarioError(source, "matrix", "an empty matrix expands to no case", matrix, MATRIX_FORMS)
    axes = []
    for key_path, values in matrix.items():
        check_key_path(source, key_path, top_keys=top_keys)
        if not isinstance(values, list) or not values:
            raise ScenarioError(source, f"matrix.{key_path}", "must be a non-empty list of values", values)
        axes.append([(key_path, value) for value in values])
    count = math.prod(len(axis) for axis in axes)
    if count > MAX_CASES:
        raise ScenarioError(source, "matrix", f"expands to {count} cases", None, f"at most {MAX_CASES}")
    return [list(combo) for combo in itertools.product(*axes)]


def _listed(source: str, matrix: list, top_keys: tuple[str, ...]) -> list[Overrides]:
    if not matrix:
        raise ScenarioError(source, "matrix", "an empty matrix expands to no case", matrix, MATRIX_FORMS)
    combos = []
    for index, entry in enumerate(matrix):
        if not isinstance(entry, dict) or not entry:
            raise ScenarioError(source, f"matrix[{index}]", "must be a non-empty mapping of key path -> value", entry)
        for key_path in entry:
            check_key_path(source, key_path, f"matrix[{index}]", top_keys)
        combos.append(list(entry.items()))
    return combos


def case_id(combo: Overrides, full: bool) -> str:
    """What varies in this case, e.g. strategy=torch.rank0,fault.rank=2 (expectations left out)."""
    items = [(k, v) for k, v in _id_items(combo) if full or k.split(".")[0] not in OUTCOME_KEYS]
    return ",".join(f"{key}={_id_value(value)}" for key, value in items)


def id_items(case_id: str) -> list[tuple[str, str]]:
    """The (key path, value text) pairs `case_id` wrote, in order; none for an id without a matrix."""
    return [(key, text) for key, equals, text in (item.partition("=") for item in case_id.split(",")) if equals]


def _id_items(combo: Overrides):
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


def check_key_path(source: str, key_path: Any, where: str = "matrix", top_keys: tuple[str, ...] = TOP_KEYS) -> None:
    if not isinstance(key_path, str) or not KEY_PATH.match(key_path):
        raise ScenarioError(source, where, "keys must be dotted key paths such as fault.rank or timeline.1.fault.step",
                            key_path)
    if key_path.split(".")[0] not in top_keys or key_path.split(".")[0] == "matrix":
        raise ScenarioError(source, f"{where}.{key_path}", "unknown key path", key_path,
                            [k for k in top_keys if k != "matrix"])


def set_path(source: str, doc: dict, key_path: str, value: Any) -> None:
    """Set ``doc``'s ``key_path`` to a copy of ``value``, through the short forms (`fault: kill`)
    and into lists by index (``timeline.1.fault.step``: the entry must exist)."""
    parts = key_path.split(".")
    node: Any = doc
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ScenarioError(source, f"matrix.{key_path}", f"{'.'.join(parts[:depth])} has no entry {part}",
                                    part, f"0..{len(node) - 1}")
            part = int(part)
        elif not isinstance(node, dict):
            raise ScenarioError(source, f"matrix.{key_path}", f"{'.'.join(parts[:depth])} is not a mapping", node)
        if last:
            node[part] = copy.deepcopy(value)
            return
        child = node[part] if isinstance(node, list) else node.get(part)
        if child is None:
            child = node[part] = {}
        elif isinstance(child, str) and part in SHORT_FORMS and (depth == 0 or part == "fault"):
            child = node[part] = {SHORT_FORMS[part]: child}
        node = child
