"""What crosses between processes is typed: every event a rank writes and every test of an event's
kind names a member of `core.events.Event`; phase and case statuses, plan starts and clock phases
are members of their enums, never bare strings (read from the source with `ast`)."""
from __future__ import annotations

import ast
import tempfile
from pathlib import Path

import pytest

from resilience.core.events import ClockPhase, Event
from resilience.core.plan import Start

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


def bare_names(source: str, field: str, values: frozenset[str]) -> list[tuple[int, str]]:
    """(line, what) for each string literal among ``values`` used as a ``field``: compared with a
    name or attribute called ``field``, assigned to one (alone or in a tuple), passed as
    ``field=``, or, for a clock phase, as the first argument of a fault's ``at``."""
    found = []

    def named(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == field) or (isinstance(node, ast.Name)
                                                                            and node.id == field)

    def literals(node: ast.expr | None) -> list[str]:
        if isinstance(node, ast.IfExp):
            return literals(node.body) + literals(node.orelse)
        return [value for value in _literals(node) if value in values] if node is not None else []

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(named(side) for side in [node.left, *node.comparators]):
            found += [(node.lineno, f"compared with {v!r}") for side in [node.left, *node.comparators]
                      for v in literals(side)]
        elif isinstance(node, ast.keyword) and node.arg == field:
            found += [(node.value.lineno, f"{field}={v!r}") for v in literals(node.value)]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts, strict=False) if isinstance(target, ast.Tuple)
                         and isinstance(node.value, ast.Tuple) else [(target, node.value)])
                found += [(node.lineno, f"{field} = {v!r}") for t, value in pairs if named(t) for v in literals(value)]
        elif (field == "phase" and isinstance(node, ast.Call) and _name(node.func) == "at" and node.args):
            found += [(node.lineno, f"at({v!r})") for v in literals(node.args[0])]
    return found


WIRE_FIELDS = {"start": (Start, "core.plan.Start"), "phase": (ClockPhase, "core.events.ClockPhase")}


@pytest.mark.parametrize("field", sorted(WIRE_FIELDS))
def test_no_plan_start_or_clock_phase_is_a_bare_string(field):
    kind, where = WIRE_FIELDS[field]
    values = frozenset(member.value for member in kind)
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for path in sorted(PACKAGE.rglob("*.py"))
             for line, what in bare_names(path.read_text(), field, values)]
    assert not found, f"{field} as a bare string (name a member of {where}):\n" + "\n".join(found)


def test_the_start_and_phase_check_sees_each_way_they_are_written():
    phases = frozenset(member.value for member in ClockPhase)
    source = ('clock.phase = "idle"\nclock.phase, clock.step = "train", 3\nfault.at("save", 8)\n'
              'phase == "load"\nClock(phase="idle" if first else "load")\nphase == "first_run"\n'
              'clock.phase = ClockPhase.IDLE\nfault.at(ClockPhase.SAVE, 8)\n{"phase": "train"}\n')
    assert [line for line, _ in bare_names(source, "phase", phases)] == [1, 2, 3, 4, 5, 5]
    starts = frozenset(member.value for member in Start)
    source = 'plan.start == "verify"\nPhasePlan(start="fresh")\nobserver.start != Start.FRESH\n'
    assert [line for line, _ in bare_names(source, "start", starts)] == [1, 2]


def test_a_plan_reads_back_its_start_as_the_member():
    import dataclasses

    from resilience.core.plan import PhasePlan

    plan = PhasePlan(name="restart", case_file="c.json", world_size=2, store_path="s", checkpoint_dir="d",
                     phase_dir="p", start=Start.STRATEGY, save=True, inject=False, record_states=False,
                     snapshot_dir=None, snapshot_step=None, rank_map=(0, 1), collective_timeout_s=5.0)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "plan.json"
        plan.write(path)
        again = PhasePlan.read(path)
    assert again == plan and again.start is Start.STRATEGY
    assert dataclasses.asdict(again)["start"] == "strategy"
