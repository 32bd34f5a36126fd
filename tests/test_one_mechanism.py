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


# -- one phase sequence ---------------------------------------------------------------------------
SEQUENCE = "run/case_sequence.py"
# the fault's calls between the runs outside the one sequence, and why
OWN_SEQUENCES = {"run/blackbox.py": "a user's script has no Case nor phases: black-box mode's launches and verdict",
                 "run/script_timeline.py": "each launch of a script's timeline sets up and heals its own fault"}
BETWEEN_RUNS = {"heal", "findings", "notes"}  # the fault's calls that order the runs


def test_the_fault_is_called_between_the_runs_only_by_the_one_phase_sequence():
    found = [f"{path.relative_to(PACKAGE)}: {name}" for path in sorted((PACKAGE / "run").glob("*.py"))
             if str(path.relative_to(PACKAGE)) not in {SEQUENCE, *OWN_SEQUENCES}
             for name in sorted(BETWEEN_RUNS & calls(path.read_text()))]
    assert not found, ("a phase sequence of its own (subclass run.case_sequence.CaseSequence and skip the steps "
                       "it does not take by name):\n" + "\n".join(found))


def _drivers() -> list[type]:
    import resilience.run.harness
    import resilience.run.torchrun  # noqa: F401  (the drivers register as subclasses on import)
    from resilience.run.case_sequence import CaseSequence

    seen, queue = [], list(CaseSequence.__subclasses__())
    while queue:
        cls = queue.pop()
        seen.append(cls)
        queue += cls.__subclasses__()
    return [cls for cls in seen if cls.__module__.startswith("resilience.")]  # not this file's own


def test_the_harness_the_torchrun_driver_and_the_explorer_take_the_one_sequence():
    from resilience.run.case_sequence import CaseSequence, Step

    drivers = {cls.__name__: cls for cls in _drivers()}
    assert {"LocalCase", "Explorer", "_Driver"} <= set(drivers), drivers
    for name, cls in drivers.items():
        assert "run" not in vars(cls) or name == "_Driver", f"{name} runs the steps in an order of its own"
        for step in Step:
            if step not in cls.skips and step.value in ("reference", "check_saves", "oracles", "probe"):
                assert getattr(cls, step.value) is not getattr(CaseSequence, step.value), (name, step)


class _Recorder:
    """What the sequence asks of a fault, in order (the sequence's own contract, without ranks)."""

    def __init__(self, leaves_saves_alone: bool):
        self.leaves_saves_alone, self.calls = leaves_saves_alone, []

    def setup(self, env):
        self.calls.append("fault.setup")

    def heal(self, env):
        self.calls.append("fault.heal")

    def findings(self, env, phases):
        self.calls.append("fault.findings")
        return ()

    def notes(self, env, phases):
        return ()

    def teardown(self, env):
        self.calls.append("fault.teardown")


def _sequence(fault: _Recorder, skipped=frozenset(), fail_at: str | None = None):
    from resilience.run.case_sequence import CaseSequence, Step

    class Steps(CaseSequence):
        skips = frozenset(Step(name) for name in skipped)

        def _step(self, name, progress):
            fault.calls.append(name)
            if name == fail_at:
                raise RuntimeError(name)
            return progress

        def reference(self, progress):
            return self._step("reference", progress)

        def first_run(self, progress):
            return self._step("first_run", progress)

        def check_saves(self, progress):
            return self._step("check_saves", progress)

        def restart(self, progress):
            return self._step("restart", progress)

        def oracles(self, progress):
            return self._step("oracles", progress)

        def probe(self, progress):
            return self._step("probe", progress)

        def judge(self, progress):
            fault.calls.append("judge")
            return "result"

    return Steps(None, fault, None)


def test_the_sequence_runs_every_step_in_its_order_and_tears_down_before_judging():
    fault = _Recorder(leaves_saves_alone=False)
    assert _sequence(fault).run() == "result"
    assert fault.calls == ["reference", "fault.setup", "first_run", "check_saves", "fault.heal", "restart",
                           "oracles", "probe", "fault.findings", "fault.teardown", "judge"]
    fault = _Recorder(leaves_saves_alone=True)  # a heal that lifts a rule: the saves are checked after it
    _sequence(fault, skipped={"probe", "oracles"}).run()
    assert fault.calls == ["reference", "fault.setup", "first_run", "fault.heal", "check_saves", "restart",
                           "fault.findings", "fault.teardown", "judge"]


def test_a_step_that_raises_still_tears_down_and_nothing_is_judged():
    fault = _Recorder(leaves_saves_alone=False)
    try:
        _sequence(fault, fail_at="restart").run()
    except RuntimeError:
        pass
    assert fault.calls[-2:] == ["restart", "fault.teardown"]
    fault = _Recorder(leaves_saves_alone=False)  # no reference, no setup: nothing to tear down
    try:
        _sequence(fault, fail_at="reference").run()
    except RuntimeError:
        pass
    assert fault.calls == ["reference"]


def test_a_step_taken_but_not_written_is_refused():
    from resilience.run.case_sequence import CaseSequence

    class Forgetful(CaseSequence):
        def first_run(self, progress):
            return progress

        def restart(self, progress):
            return progress

        def judge(self, progress):
            return None

    fault = _Recorder(leaves_saves_alone=False)
    try:
        Forgetful(None, fault, None).run()
    except NotImplementedError as error:
        assert "reference" in str(error) and "skips" in str(error)
    else:
        raise AssertionError("a step with no implementation ran")
