"""The node agent of the planted two-tier checkpoint (`resilience.planted.tier_bugs`):
``python -m resilience.planted.memory_agent``. It owns nothing but the node's lifetime: the node's
memory tier lives under its name in ``/dev/shm``, which the harness removes when the node is lost or
the job ends. It follows `resilience.core.node_agents`'s protocol and has no duties of its own.
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from ..core.node_agents import DIR_ENV, READY, answered

POLL_S = 0.05


def main() -> None:
    directory = Path(os.environ[DIR_ENV])
    requests: list[int] = []
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: requests.append(signal.SIGUSR1))
    signal.signal(signal.SIGUSR2, lambda *_: requests.append(signal.SIGUSR2))
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    (directory / READY).write_text(str(os.getpid()))
    count = 0
    while not stop.wait(POLL_S):
        while requests:
            requests.pop(0)
            count += 1
            answered(directory, count).write_text("")


if __name__ == "__main__":
    main()
