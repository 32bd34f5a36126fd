"""The node agent of the planted two-tier checkpoint (`resilience.planted.tier_bugs`):
``python -m resilience.planted.memory_agent``. It owns nothing but the node's lifetime: the node's
memory tier lives under its name in ``/dev/shm``, which the harness removes when the node is lost or
the job ends. It follows `resilience.core.node_agents`'s protocol and has no duties of its own.
"""
from __future__ import annotations

import os

from ..core.node_agents import DIR_ENV, serve


def main() -> None:
    serve(os.environ[DIR_ENV], workers_failed=lambda: None, job_ended=lambda: None)


if __name__ == "__main__":
    main()
