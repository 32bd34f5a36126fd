"""A warm rank: one live process that runs restore after restore, each in a new process group.

`python -m resilience.rank.warm_rank POOL_DIR RANK WORLD_SIZE` (or forked from the fork server).
The controller (`resilience.run.warm_pool`) hands out restores as files in ``POOL_DIR``:

- ``job<N>.json`` (``{"plan": PATH}``, renamed into place): run restore N, a restart `PhasePlan`;
- the rank answers ``done<N>.rank<R>`` (renamed into place) once restore N ended: the exit status
  a fresh rank would have had (1: it raised; the error is in its events) and what the restore left
  behind in this process (threads, child processes, signal handlers); it exits if it left anything:
  a process whose state changed is not reused;
- ``stop``: exit.

Each restore joins its own process group through a PrefixStore (``restore<N>/``) over one TCPStore,
writes its events and logs where the plan says, and destroys its group at the end, after an error
too. A peer left waiting in a collective does not answer: the controller then replaces the group.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from ..core.events import EventLog
from ..core.plan import PhasePlan
from ..core.waiting import wait_until
from .startup import begin_rank, exit_now, redirect_output, report_failure
from .worker import run

POLL_S = 0.002
STORE_WAIT_S = 120.0  # rank 0 of the pool imports torch first: seconds on a loaded machine
WATCHED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2, signal.SIGALRM)


def job_path(pool_dir: Path, job: int) -> Path:
    return pool_dir / f"job{job}.json"


def done_path(pool_dir: Path, job: int, rank: int) -> Path:
    return pool_dir / f"done{job}.rank{rank}"


def answer(pool_dir: Path, job: int, rank: int) -> int | None:
    """The exit status rank ``rank`` answered for restore ``job``, or None while it has not."""
    answered = _answer(pool_dir, job, rank)
    return None if answered is None else answered["status"]


def left_behind(pool_dir: Path, job: int, rank: int) -> list[str]:
    """What restore ``job`` left in rank ``rank``'s process (it then exits instead of serving on)."""
    answered = _answer(pool_dir, job, rank)
    return [] if answered is None else answered["leftovers"]


def _answer(pool_dir: Path, job: int, rank: int) -> dict | None:
    try:
        return json.loads(done_path(pool_dir, job, rank).read_text())
    except FileNotFoundError:
        return None


def process_state() -> dict:
    """What a restore must leave as it found it for the process to be reused."""
    children = set()
    for task in os.listdir("/proc/self/task"):
        try:
            children.update(Path(f"/proc/self/task/{task}/children").read_text().split())
        except OSError:
            pass
    import torch.distributed as dist

    # torch names each new group by a per-process counter, reset only when a formed group is
    # destroyed: a rendezvous that timed out on one rank leaves its counter ahead of its peers', and
    # every later group of the pool would wait for keys its peers never write
    return {"threads": sorted(_thread_names()), "children": sorted(children),
            "signals": [repr(signal.getsignal(signum)) for signum in WATCHED_SIGNALS],
            "groups": dist.get_pg_count()}


def _thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:  # ended meanwhile
            pass
    return names


def leftovers(before: dict, after: dict) -> list[str]:
    """What differs between two `process_state`s, in words."""
    found = []
    if len(after["threads"]) > len(before["threads"]):
        new = list(after["threads"])
        for name in before["threads"]:
            if name in new:
                new.remove(name)
        found.append(f"{len(after['threads']) - len(before['threads'])} more threads ({', '.join(new)})")
    children = [child for child in after["children"] if child not in before["children"]]
    if children:
        found.append(f"child processes {', '.join(children)}")
    if after["signals"] != before["signals"]:
        found.append("signal handlers changed")
    if after["groups"] != before["groups"]:
        found.append(f"process group counter at {after['groups']}, not {before['groups']} (a group that never "
                     f"formed)")
    return found


def serve(pool_dir: Path, rank: int, world_size: int) -> int:
    import torch.distributed as dist

    begin_rank()
    parent = os.getppid()
    base_store = _pool_store(pool_dir, rank, world_size)
    clean = None  # the state each restore must leave, once the strategy's process-wide helpers run
    job = 0
    while True:
        path = job_path(pool_dir, job)
        while not path.exists():
            if (pool_dir / "stop").exists() or os.getppid() != parent:
                return 0
            time.sleep(POLL_S)
        plan = PhasePlan.read(Path(json.loads(path.read_text())["plan"]))
        redirect_output(plan.log_paths(rank))
        events = EventLog(plan.events_path(rank), rank)
        if clean is None:  # a pool serves one case: one strategy
            _warm_strategy_process(plan)
            clean = process_state()
        status = 0
        try:
            run(plan, rank, events, store=dist.PrefixStore(f"restore{job}/", base_store))
        except Exception as exc:  # evidence for the verdict, as in a fresh rank, which exits 1
            report_failure(events, exc)
            status = 1
            if dist.is_initialized():  # a peer in a collective sees the connection close and raises
                dist.destroy_process_group()
        except BaseException as exc:
            report_failure(events, exc)
            os._exit(1)
        left = leftovers(clean, process_state())
        answer = done_path(pool_dir, job, rank)
        partial = answer.with_name(answer.name + ".tmp")
        partial.write_text(json.dumps({"status": status, "leftovers": left}))
        os.replace(partial, answer)
        if left:
            return 0
        job += 1


def _warm_strategy_process(plan: PhasePlan) -> None:
    from ..core import registry
    from ..core.case import Case

    case = Case.read(Path(plan.case_file))
    registry.resolve("strategy", case.strategy.name).warm_process(case.strategy.options)


def _pool_store(pool_dir: Path, rank: int, world_size: int):
    """One TCPStore on 127.0.0.1 for the pool's life, hosted by rank 0 on a free port it publishes
    in ``pool_dir/port`` (under a FileStore, init_process_group timed out at random here)."""
    import torch.distributed as dist

    port_file = pool_dir / "port"
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
        partial = pool_dir / "port.tmp"
        partial.write_text(str(store.port))
        os.replace(partial, port_file)
        return store
    if not wait_until(port_file.exists, STORE_WAIT_S, interval_s=POLL_S):
        raise RuntimeError(f"warm rank {rank}: rank 0 of the pool wrote no store port in {pool_dir} "
                           f"within {STORE_WAIT_S:g} s")
    return dist.TCPStore("127.0.0.1", int(port_file.read_text()), world_size, is_master=False)


if __name__ == "__main__":
    exit_now(serve(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
