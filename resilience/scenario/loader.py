"""YAML scenario files -> validated, matrix-expanded `Scenario`s: the entry the commands and workers use.

Every problem becomes a `ScenarioError` naming the file, the key path, the bad value and what is
allowed; all the problems of a file come in one error, and nothing else escapes from here. The
pieces: `safe_yaml` (bounded, strict YAML), `matrix` (cases and their ids), `validate` (one case),
`schema` (the keys and values allowed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.case import Case, Scenario
from ..core.script_case import ScriptCase
from ..core.sizes import parse_size
from ..errors import ScenarioError
from .checks import Problems, Validator
from .matrix import MAX_CASES, expand_cases
from .safe_yaml import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, parse_yaml, read_scenario_text
from .schema import DEFAULT_TIMEOUTS, RESTART_KEYS, TOP_KEYS, TOPOLOGY_KEYS, TRIGGER_KEYS, WORKLOAD_KEYS
from .script_case import is_script_document, load_script_document
from .validate import check_case

__all__ = ["DEFAULT_TIMEOUTS", "MAX_CASES", "MAX_DEPTH", "MAX_FILE_BYTES", "MAX_NODES", "RESTART_KEYS",
           "TOPOLOGY_KEYS", "TOP_KEYS", "TRIGGER_KEYS", "WORKLOAD_KEYS", "load_document", "load_file", "load_text",
           "parse_case", "parse_size"]


def load_file(path: Path | str) -> Scenario:
    return load_text(read_scenario_text(Path(path)), str(path))


def load_any_file(path: Path | str) -> Scenario | tuple[ScriptCase, ...]:
    """A scenario on the framework's strategies, or the cases of one on a user's script."""
    document = parse_yaml(read_scenario_text(Path(path)), str(path))
    if is_script_document(document):
        return load_script_document(document, str(path))
    return load_document(document, str(path))


def is_script_file(path: Path | str) -> bool:
    """Whether a scenario file describes a user's script (read without validating it)."""
    try:
        return is_script_document(parse_yaml(read_scenario_text(Path(path)), str(path)))
    except ScenarioError:
        return False


def load_text(text: str, source: str) -> Scenario:
    return load_document(parse_yaml(text, source), source)


def load_document(document: Any, source: str) -> Scenario:
    """Every case of the document, or one `ScenarioError` listing each problem of every case."""
    if is_script_document(document):
        raise ScenarioError(source, "script", "a scenario on a user's own script runs under pytest (pytest "
                            "scenarios/) or `resilience blackbox`; this command takes scenarios on strategies")
    problems = Problems(source)
    doc = Validator(source, problems=problems).mapping("", document, TOP_KEYS)
    cases = expand_cases(source, doc, TOP_KEYS, problems, check_case)
    return Scenario(path=source, name=cases[0].name, cases=tuple(cases))


def parse_case(document: Any, source: str, case_id: str = "", where: str = "") -> Case:
    """Validate one case document (a scenario without `matrix`). Workers re-parse what the harness sends."""
    problems = Problems(source)
    case = check_case(document, source, case_id, where, problems)
    problems.raise_any()
    return case
