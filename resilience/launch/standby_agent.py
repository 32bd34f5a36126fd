"""A spare node's torchrun agent, standing by warm: ``python -m resilience.launch.standby_agent PATH
SECONDS TORCHRUN_ARGS...`` imports torchrun (``import torch``: seconds on a busy machine), waits until
PATH exists (the scheduler hands the node to the job) and then runs torchrun's own ``main`` with
the arguments, in this process. A spare's agent thus joins the running job's rendezvous a moment
after the hand-over, as a node that was up and waiting does; a cold start after the hand-over
raced a short shrunk group, which could finish first (the job then never grew)."""
from __future__ import annotations

import sys
from pathlib import Path

from ..core.waiting import wait_until

USAGE = "usage: python -m resilience.launch.standby_agent PATH SECONDS TORCHRUN_ARGS..."
POLL_S = 0.05


def main(argv: list[str]) -> int:
    try:
        handed_over, seconds, torchrun_args = Path(argv[1]), float(argv[2]), argv[3:]
    except (IndexError, ValueError):
        print(f"{USAGE}; got {argv[1:]!r}", file=sys.stderr)
        return 2
    from torch.distributed import run as torchrun

    if not wait_until(handed_over.exists, seconds, interval_s=POLL_S):
        print(f"standby: {handed_over} not created within {seconds:g} s; the spare was never handed over",
              file=sys.stderr)
        return 1
    torchrun.main(torchrun_args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
