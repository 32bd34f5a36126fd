"""The order cases run in: longest first, those that mostly wait kept apart, from the costs the last
run recorded; and the CPU time of a process tree those costs are measured with."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from resilience.commands import case_durations
from resilience.commands.case_durations import WAITING_SPACING, CaseCost
from resilience.core.processes import tree_cpu_seconds


def order(costs: dict[str, CaseCost], ids: list[str]) -> list[str]:
    return case_durations.run_order(ids, costs, lambda case: case)


def test_cases_run_longest_first_and_unseen_first():
    costs = {"a": CaseCost(1.0, 1.0), "b": CaseCost(9.0, 9.0), "c": CaseCost(5.0)}
    assert order(costs, ["a", "b", "c", "new"]) == ["new", "b", "c", "a"]


def test_cases_that_mostly_wait_are_spaced_apart_and_none_is_lost():
    waiting = {f"wait{n}": CaseCost(30.0 - n, 1.0) for n in range(3)}  # long, and idle
    computing = {f"cpu{n}": CaseCost(20.0 - n, 30.0) for n in range(8)}
    ordered = order({**waiting, **computing}, sorted(waiting) + sorted(computing))
    assert sorted(ordered) == sorted([*waiting, *computing])
    places = [index for index, case in enumerate(ordered) if case in waiting]
    assert places == [0, 1 + WAITING_SPACING, 2 * (1 + WAITING_SPACING)]  # the longest first, then spaced
    assert [case for case in ordered if case in computing] == sorted(computing, key=lambda c: -computing[c].seconds)


def test_waiting_cases_left_over_run_last_in_their_order():
    costs = {"wait0": CaseCost(9.0, 0.1), "wait1": CaseCost(8.0, 0.1), "cpu": CaseCost(1.0, 2.0)}
    assert order(costs, ["cpu", "wait1", "wait0"]) == ["wait0", "cpu", "wait1"]


def test_the_file_keeps_seconds_and_cpu_and_reads_older_files_of_seconds(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"old": 3.5, "bad": "x", "new": {"seconds": 2.0, "cpu_seconds": 0.5}}))
    assert case_durations.read(path) == {"old": CaseCost(3.5), "new": CaseCost(2.0, 0.5)}
    case_durations.write(path, {"old": CaseCost(4.0, 8.0)})
    assert case_durations.read(path) == {"old": CaseCost(4.0, 8.0), "new": CaseCost(2.0, 0.5)}
    assert CaseCost(2.0, 0.5).mostly_waits and not CaseCost(2.0, 1.5).mostly_waits and not CaseCost(2.0).mostly_waits


def test_tree_cpu_counts_a_grandchild_reaped_by_its_parent():
    """The way a rank's CPU is counted: forked by a server (here a child), reaped by it, gone."""
    spin = "import time\nwhile time.process_time() < 1.0: pass"  # one CPU second, however busy the machine
    burn = (f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}]); "
            "print('reaped', flush=True); import time; time.sleep(60)")
    before = tree_cpu_seconds(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "reaped\n"  # the grandchild is gone, its time in the child's
        assert tree_cpu_seconds(os.getpid()) - before >= 0.99  # clock ticks: 10 ms each
    finally:
        child.kill()
        child.wait()
