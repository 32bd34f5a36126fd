"""One rank under torchrun: ``torchrun ... -m resilience.rank.elastic_entry CASE_DIR``.

The first incarnation (the driver's launch 0, TORCHELASTIC_RESTART_COUNT 0) runs the uninterrupted
reference and then the first run with the fault armed, in one process group: the reference comes
from the very ranks, devices, backend and placement under test, on every node, with no cache to
share. Every later incarnation (the elastic agent's restart after a rank died, or the driver's next
launch) restores with the strategy and trains to the end.

The process torchrun starts is a small supervisor: it forks the rank before anything imports torch,
waits for it, records how it ended in the incarnation's outcome file (a SIGKILLed rank cannot say
so itself), and then ends the same way, so the agent sees what it would see without it.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ..core.durable import write_atomically
from ..core.elastic_layout import (
    EARLY,
    LAUNCH_ENV,
    NODE_ENV,
    Incarnation,
    TorchrunLayout,
    claim_incarnation,
)
from ..core.events import Event, EventLog
from ..core.plan import FIRST_RUN, REFERENCE, RESTART, PhasePlan
from ..core.processes import die_with_parent
from .startup import begin_rank, redirect_output, report_failure

USAGE = "usage: torchrun ... -m resilience.rank.elastic_entry CASE_DIR (written by resilience.run.torchrun)"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[1], "case.json").is_file():
        print(f"{USAGE}; got {argv[1:]!r}", file=sys.stderr)
        return 2
    layout = TorchrunLayout(Path(argv[1]))
    rank = int(os.environ["RANK"])
    incarnation = claim_incarnation(layout.case_dir, int(os.environ.get(LAUNCH_ENV, "0")),
                                    int(os.environ["WORLD_SIZE"]), layout.first_run_size())
    die_with_parent()  # with torchrun's agent
    if incarnation.restart == EARLY:  # a node of the first run is still to join: its agent waits for
        while True:                   # ours to see it (num_nodes_waiting) and tear this group down
            time.sleep(60)
    layout.incarnation_dir(incarnation).mkdir(parents=True, exist_ok=True)
    child = os.fork()
    if child == 0:
        os._exit(_rank(layout, incarnation, rank))
    return _supervise(layout, incarnation, rank, child)


def _supervise(layout: TorchrunLayout, incarnation: Incarnation, rank: int, child: int) -> int:
    torn_down: list[str] = []

    def forward(signum, _frame):  # the agent tears the group down: pass it on, remember who ended it
        torn_down.append(signal.Signals(signum).name)
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    write_atomically(layout.outcome_path(incarnation, rank), json.dumps(
        {"rank": rank, "pid": child, "returncode": code, "torn_down_by": torn_down[0] if torn_down else None}))
    if code < 0:  # end as the rank did: the agent reports the same signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(5)
    return code


def _rank(layout: TorchrunLayout, incarnation: Incarnation, rank: int) -> int:
    begin_rank()  # dies with the supervisor; the driver's HANG dump on SIGUSR1
    names = (REFERENCE, FIRST_RUN) if incarnation.is_first else (RESTART,)
    plans = [layout.plan(incarnation, name) for name in names]
    events = None
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from ..core.device import for_rank
        from .worker import run

        torch.set_num_threads(1)  # reductions over several threads change the bits of a sum
        placement = for_rank(rank)
        _check_node(plans, rank)
        for plan in plans:
            _enter(plan, rank)
            events = EventLog(plan.events_path(rank), rank)
            events.emit(Event.PHASE_BEGIN, phase=plan.name, launch=incarnation.launch,
                        restart_count=incarnation.restart,
                        agent_restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                        node=os.environ.get(NODE_ENV), group_rank=int(os.environ.get("GROUP_RANK", "0")),
                        local_rank=int(os.environ.get("LOCAL_RANK", rank)), device=placement.device,
                        backend=placement.backend)
            if not dist.is_initialized():
                _join(placement.backend, rank, incarnation, timedelta(seconds=plan.collective_timeout_s))
            run(plan, rank, events)
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # every failure, SystemExit included, is evidence for the verdict
        if events is None:
            _enter(plans[0], rank)
            events = EventLog(plans[0].events_path(rank), rank)
        report_failure(events, exc)
        return 1


def _check_node(plans: list[PhasePlan], rank: int) -> None:
    """The group torchrun formed must be the one the plans describe: its size (an elastic restart
    at another size than the case's restart), and with node-local storage this rank's node (c10d
    orders nodes by address), else it would read another node's disk."""
    node, size = os.environ.get(NODE_ENV), int(os.environ["WORLD_SIZE"])
    for plan in plans:
        if plan.world_size != size:
            raise RuntimeError(f"torchrun formed a group of {size} ranks, but the {plan.name} phase is planned "
                               f"for {plan.world_size} (the case's restart.world_size under --nnodes MIN:MAX)")
        topology = plan.placement()
        if node is not None and topology.storage == "node_local" and topology.node_of(rank) != int(node):
            raise RuntimeError(f"rank {rank} runs on node {node}, but the {plan.name} topology places it on node "
                               f"{topology.node_of(rank)} ({topology.describe()}): start the nodes in that order")


def _join(backend: str, rank: int, incarnation: Incarnation, timeout) -> None:
    """Join the process group through torchrun's store. The agent keeps one store for all its
    restarts, so each incarnation uses keys of its own: a restarted group must not read the
    addresses the dead group published (seen here as "Gloo connectFullMesh failed ... Connection
    refused" in the restarted ranks)."""
    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # no agent store: torch's env:// as usual
        dist.init_process_group(backend, timeout=timeout)
        return
    world_size = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"resilience/{incarnation.name}", store),
                            rank=rank, world_size=world_size, timeout=timeout)


def _enter(plan: PhasePlan, rank: int) -> None:
    """Make the phase's directory, plan file and this rank's log files current (stdout, stderr and
    the stack faulthandler dumps go to the phase the rank is in)."""
    directory = Path(plan.phase_dir)
    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / "plan.json", json.dumps(asdict(plan), indent=1))
    redirect_output(plan.log_paths(rank))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
