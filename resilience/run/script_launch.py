"""One torchrun launch of a user's script (black-box mode): its command line, and whether a
launch that went wrong failed in the launcher rather than in the script."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from ..core.elastic_layout import Incarnation
from ..core.events import tail
from ..errors import LauncherFailed
from .blackbox_records import BlackBoxJob

PLACEHOLDER = "{checkpoint_dir}"
#: torchrun's rendezvous errors (torch.distributed.elastic.rendezvous.api), in the agent's output
RENDEZVOUS_FAILURE = re.compile(r"^(?:torch\.distributed\.elastic\.rendezvous\.api\.)?"
                                r"Rendezvous(?:Timeout|Closed|Connection|State)?Error:[^\n]*", re.MULTILINE)


def torchrun_command(job: BlackBoxJob, run_dir: Path, args: tuple[str, ...], restarts: int, ranks: int) -> list[str]:
    """``torchrun --standalone`` with ``ranks`` ranks; ``{checkpoint_dir}`` names the run's."""
    checkpoint_dir = str(run_dir / "checkpoints")
    return [job.python, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(ranks), "--max-restarts", str(restarts),
            "--monitor-interval", "0.1", str(job.script),
            *(arg.replace(PLACEHOLDER, checkpoint_dir) for arg in args)]


def check_launcher(job: BlackBoxJob, run_dir: Path, launch: int, command: list[str], failed: bool) -> None:
    """Raise `LauncherFailed` where torchrun started no rank (by its end or its deadline), or
    ended in failure on a rendezvous error it raised (its warnings may name one in passing)."""
    log = (run_dir / f"torchrun.launch{launch}.log").read_text(errors="replace")
    started = (run_dir / Incarnation(launch, 0).name).is_dir()
    rendezvous = RENDEZVOUS_FAILURE.search(log) if failed else None
    if started and not rendezvous:
        return
    what = "started no rank" if not started else f"failed in its rendezvous ({rendezvous.group(0)})"
    reproduce = shlex.join([f"{name}={value}" for name, value in job.env.items()] + command)
    raise LauncherFailed(f"torchrun {what}: a failure of the launcher, not a verdict on {job.script}; "
                         f"reproduce it with\n  {reproduce}\n{tail(run_dir / f'torchrun.launch{launch}.log')}")
