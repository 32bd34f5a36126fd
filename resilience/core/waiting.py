"""Waiting for something outside this process (a file, a signal, another process's end) until a
deadline: the one polling loop, so every wait has a deadline and none is written twice."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(ready: Callable[[], T], timeout_s: float, *, interval_s: float = 0.02,
               give_up: Callable[[], bool] | None = None) -> T | None:
    """``ready()`` every ``interval_s`` until it returns something true, which is returned; None
    once ``timeout_s`` passed or ``give_up()`` holds (checked after ``ready``, so a thing that
    became ready as its source ended is still seen). ``ready`` is asked once more at the deadline:
    what happened during the last sleep counts."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = ready()
        if found:
            return found
        if give_up is not None and give_up():
            return None
        if time.monotonic() >= deadline:
            return ready() or None
        time.sleep(interval_s)
