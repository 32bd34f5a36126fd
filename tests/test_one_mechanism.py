"""One implementation of each mechanism, read from the source with `ast`: waiting until a deadline
is `core.waiting.wait_until`, and watching processes to their end is `run.supervisor.supervise`;
and the waiting helper itself keeps its promises."""
from __future__ import annotations

import ast
import time
from pathlib import Path

from resilience.core.waiting import wait_until

PACKAGE = Path(__file__).resolve().parent.parent / "resilience"
WAITING = "core/waiting.py"
SUPERVISOR = "run/supervisor.py"
# loops that keep a clock of their own, and why
OWN_CLOCKS = {"faults/at_rest/straggler.py": "repeats its overwrite of the files for a set time",
             "core/janitor.py": "runs as a script of its own (python -I janitor.py): the standard library only"}


def loops(source: str, *reads: str) -> list[int]:
    """Lines of the ``while`` loops whose code reads each of ``reads`` and sleeps."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.While)
            and "sleep(" in (text := ast.unparse(node)) and all(read in text for read in reads)]


def _found(reads: tuple[str, ...], allowed: set[str]) -> list[str]:
    return [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
            if str(path.relative_to(PACKAGE)) not in allowed for line in loops(path.read_text(), *reads)]


def test_every_wait_until_a_deadline_is_wait_until():
    found = _found(("monotonic()",), {WAITING, *OWN_CLOCKS})
    assert not found, "a hand-written poll-until-deadline loop (use core.waiting.wait_until):\n" + "\n".join(found)


def test_processes_are_watched_to_their_end_by_the_one_supervisor():
    found = _found((".poll()",), {SUPERVISOR})
    assert not found, ("a second supervise loop (make the processes a run.supervisor.RankGroup and call "
                       "supervise):\n" + "\n".join(found))


def test_the_checks_see_a_hand_written_loop():
    source = ("def f(deadline):\n    while time.monotonic() < deadline:\n        time.sleep(0.1)\n"
              "def g(p):\n    while p.poll() is None:\n        time.sleep(0.1)\n"
              "def h(n):\n    while n:\n        n -= 1\n")
    assert loops(source, "monotonic()") == [2] and loops(source, ".poll()") == [5]


def test_wait_until_returns_what_became_ready():
    ready_at = time.monotonic() + 0.1
    assert wait_until(lambda: time.monotonic() > ready_at and "ready", 5.0, interval_s=0.01) == "ready"


def test_wait_until_gives_none_at_its_deadline_having_asked_once_more():
    asked = []

    def never() -> bool:
        asked.append(time.monotonic())
        return False

    started = time.monotonic()
    assert wait_until(never, 0.2, interval_s=0.05) is None
    assert asked[-1] - started >= 0.2 and len(asked) >= 3


def test_wait_until_stops_when_told_to_give_up_but_sees_what_came_ready_first():
    calls = []
    assert wait_until(lambda: calls.append(1) and False, 60.0, give_up=lambda: len(calls) >= 2) is None
    assert len(calls) == 2
    assert wait_until(lambda: "done", 60.0, give_up=lambda: True) == "done"


# every way a rank process begins, and the function it begins in
RANK_ENTRY_POINTS = {"rank/worker.py": "main", "rank/checkpoint_check.py": "main", "rank/warm_rank.py": "serve",
                     "rank/elastic_entry.py": "_rank", "rank/blackbox_hook.py": "install"}
STARTUP = "rank/startup.py"


def calls(source: str, function: str | None = None) -> set[str]:
    """What is called in ``source``, or in its function ``function``: ``f`` for ``f(...)``, ``f``
    and ``x.f`` for ``x.f(...)``, and ``f`` for ``x.y.f(...)``."""
    tree = ast.parse(source)
    if function is not None:
        tree = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == function)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            found.add(node.func.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            found.add(node.func.attr)
            if isinstance(node.func.value, ast.Name):
                found.add(f"{node.func.value.id}.{node.func.attr}")
    return found


def test_every_rank_entry_point_begins_with_the_one_start_up():
    missing = [f"{path}:{function}" for path, function in RANK_ENTRY_POINTS.items()
               if "begin_rank" not in calls((PACKAGE / path).read_text(), function)]
    assert not missing, "rank entry points that do not call rank.startup.begin_rank:\n" + "\n".join(missing)


def test_only_the_start_up_asks_for_a_stack_dump_or_death_with_the_parent():
    homes = {"faulthandler.register": STARTUP, "prctl": "core/processes.py"}  # die_with_parent and its undoing
    found = [f"{path.relative_to(PACKAGE)}: {name}" for path in sorted(PACKAGE.rglob("*.py"))
             for name in sorted(set(homes) & calls(path.read_text())) if str(path.relative_to(PACKAGE)) != homes[name]]
    assert not found, "a rank start-up of its own (use rank.startup.begin_rank):\n" + "\n".join(found)


def test_the_entry_point_checks_see_a_start_up_of_its_own():
    source = "def main():\n    faulthandler.register(signal.SIGUSR1)\n    run()\ndef serve():\n    begin_rank()\n"
    assert "begin_rank" not in calls(source, "main") and "begin_rank" in calls(source, "serve")
    assert "faulthandler.register" in calls(source) and "faulthandler.register" not in calls("janitor.register(1)")
