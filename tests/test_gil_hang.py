"""The gil_hang fault: a real C call (libc sleep through ctypes.PyDLL) that keeps the GIL."""
from __future__ import annotations

import threading
import time
from itertools import pairwise

import pytest

from resilience.core.case import VerdictKind
from resilience.faults.process.gil_hang import hold_gil

from .harness_helpers import run_case


def test_the_holder_really_keeps_the_gil_from_other_threads():
    ticks: list[float] = []
    holding, stop = threading.Event(), threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)  # releases the GIL: only a holder that keeps it can stop this loop

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    while not ticks:
        time.sleep(0.01)
    threading.Thread(target=hold_gil, args=(2, holding), daemon=True).start()
    holding.wait()  # returns once the holder lets go of the GIL, 2 s later
    time.sleep(0.05)
    stop.set()
    counter.join(timeout=30)
    gaps = [b - a for a, b in pairwise(ticks)]
    assert max(gaps) > 1.5, max(gaps)  # no tick while the holder slept in C


@pytest.mark.slow
def test_past_the_deadline_the_verdict_is_hang_and_the_dump_names_the_holder(tmp_path):
    result = run_case(tmp_path, fault={"kind": "gil_hang", "rank": 1, "step": 6, "phase": "train"},
                      expect="fails_loudly", timeouts={"collective": 60, "phase": 25})
    assert result.verdict.kind is VerdictKind.HANG and result.verdict.hung_phase == "first_run"
    holder = next(f for f in result.verdict.findings if "GIL held by Thread 0x" in f)
    assert "in hold_gil (faults/process/gil_hang.py:" in holder and "ctypes.PyDLL" in holder
    assert "gil-holder" not in holder  # named from the dump itself, not from the fault's own event
    assert any("rank 0: waiting in all_reduce" in f for f in result.verdict.findings)
