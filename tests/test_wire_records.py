"""What crosses between processes is typed: every event a rank writes and every test of an event's
kind names a member of `core.events.Event`, never a bare string (read from the source with `ast`)."""
from __future__ import annotations

import ast
from pathlib import Path

from resilience.core.events import Event

PACKAGE = Path(__file__).resolve().parent.parent / "resilience"


def bare_event_kinds(source: str) -> list[tuple[int, str]]:
    """(line, what) for each string literal used as an event kind: the first argument of an
    ``emit`` or ``events`` call, or a side of a comparison with ``record["event"]``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and _name(node.func) in ("emit", "events"):
            if _literals(node.args[0]):
                found.append((node.lineno, f"{_name(node.func)}({node.args[0].value!r})"))
        elif isinstance(node, ast.Compare) and any(_is_event_field(side) for side in [node.left, *node.comparators]):
            found += [(node.lineno, f"compared with {literal!r}") for side in [node.left, *node.comparators]
                      for literal in _literals(side)]
    return found


def _name(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _is_event_field(node: ast.expr) -> bool:
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "event"


def _literals(node: ast.expr) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)]


def test_no_event_kind_is_a_bare_string():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for path in sorted(PACKAGE.rglob("*.py"))
             for line, what in bare_event_kinds(path.read_text())]
    assert not found, "event kinds as bare strings (name a member of core.events.Event):\n" + "\n".join(found)


def test_the_check_sees_each_way_a_kind_is_written():
    source = ('events.emit("loss", step=1)\nemit("done")\nphase.events("joined")\n'
              'e["event"] == "error"\ne["event"] in ("restored", "state")\n"x" != e["event"]\n'
              'events.emit(Event.LOSS)\ne["event"] == Event.ERROR\nd["kind"] == "loss"\n')
    assert [line for line, _ in bare_event_kinds(source)] == [1, 2, 3, 4, 5, 5, 6]


def test_a_kind_reads_back_as_the_string_it_was_written_as():
    import json

    record = json.loads(json.dumps({"event": Event.FAULT_FIRED}))
    assert record["event"] == Event.FAULT_FIRED == "fault_fired" and f"{Event.FAULT_FIRED}" == "fault_fired"
    assert {record["event"]: 1}[Event.FAULT_FIRED] == 1  # hashed as its string: a dict of kinds finds it


def bare_statuses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each string literal used as a phase's or a case's status: compared with a
    ``status`` name or attribute, or passed as ``status=``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_is_status(side) for side in [node.left, *node.comparators]):
            found += [(node.lineno, f"compared with {literal!r}") for side in [node.left, *node.comparators]
                      for literal in _literals(side)]
        elif isinstance(node, ast.keyword) and node.arg == "status":
            found += [(node.value.lineno, f"status={literal!r}") for literal in _literals(node.value)]
    return found


def _is_status(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "status") or (isinstance(node, ast.Name)
                                                                           and node.id == "status")


def test_no_phase_or_case_status_is_a_bare_string():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for path in sorted(PACKAGE.rglob("*.py"))
             for line, what in bare_statuses(path.read_text())]
    assert not found, ("statuses as bare strings (name a member of core.records.PhaseStatus or "
                       "oracle.outcome.CaseStatus):\n" + "\n".join(found))


def test_the_status_check_sees_each_way_a_status_is_written():
    source = ('phase.status == "completed"\nstatus != "failed"\nr.status in ("skipped", "error")\n'
              'PhaseResult(status="deadline")\nphase.status == PhaseStatus.DEADLINE\nd["status"] == "x"\n')
    assert [line for line, _ in bare_statuses(source)] == [1, 2, 3, 3, 4]
