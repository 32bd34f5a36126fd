"""Faults in the processes a rank's libraries start themselves (a checkpoint writer started with
the spawn method): they inherit the rank's environment, so the rank exposes its fault there
through a startup hook (``resilience/rank/startup/sitecustomize.py``) before the library starts them.
The harness starts a node's agent (`resilience.run.node_agents`) with the same hook, as ``agent``.

In such a helper the fault is armed with ``process="helper"``, follows the step of the last save its
rank began (a background writer writes after the rank's save call returned), writes its events into
the rank's event log, and reaches the helper's files through the same interception layer as in the
rank. In an agent, the fault also hears each background save the agent makes (``agent_persisting``).
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

ENV_VAR = "RESILIENCE_HELPER_HOOK"
STARTUP_DIR = Path(__file__).resolve().parent / "startup"


def hook_environment(*, rank: int, world_size: int, case_file: Path, checkpoint_dir: Path, events_path: Path,
                     clock_path: Path, process: str = "helper", rank_pid: int = 0,
                     python_path: str = "", node_index: int = 0) -> dict[str, str]:
    """The environment that arms the fault in every Python process started with it: ``process``
    names what it is (a rank's ``helper``, or a node's ``agent``, which the harness starts with it,
    ``node_index`` its node's place among the case's nodes); it follows rank ``rank``'s clock and
    writes into its event log."""
    from ..core.paths import PROJECT_ROOT

    return {ENV_VAR: json.dumps({
        "rank": rank, "world_size": world_size, "case_file": str(case_file), "rank_pid": rank_pid,
        "checkpoint_dir": str(checkpoint_dir), "events": str(events_path), "clock": str(clock_path),
        "project_root": str(PROJECT_ROOT), "process": process,
        "node_index": node_index}),
        "PYTHONPATH": os.pathsep.join([str(STARTUP_DIR)] + [p for p in python_path.split(os.pathsep) if p])}


def expose(*, rank: int, world_size: int, case_file: Path, checkpoint_dir: Path, events_path: Path,
           clock_path: Path) -> None:
    """In the rank, before any library starts a helper: every child it starts arms the fault."""
    os.environ.update(hook_environment(rank=rank, world_size=world_size, case_file=case_file,
                                       checkpoint_dir=checkpoint_dir, events_path=events_path,
                                       clock_path=clock_path, rank_pid=os.getpid(),
                                       python_path=os.environ.get("PYTHONPATH", "")))


def install(config_text: str) -> None:
    """In a helper process, at interpreter start."""
    config = json.loads(config_text)
    if config["rank_pid"] == os.getpid():
        return  # the rank itself (re-executed): it arms its fault on its own
    from ..core import registry
    from ..core.case import Case
    from ..core.events import EventLog
    from ..core.node_agents import listen_to_persists
    from ..disk.interception import Interceptor
    from ..faults.base import FollowedClock, RankEnvironment, WriteListener

    case = Case.read(Path(config["case_file"]))
    fault = registry.resolve("fault", case.fault.kind)(case.fault)
    checkpoint_dir = Path(config["checkpoint_dir"])

    def emit(event, **fields) -> None:  # opened per event: an agent starts before the phase's directory exists
        log = EventLog(Path(config["events"]), config["rank"])
        log.emit(event, **fields)
        log.close()

    if isinstance(fault, WriteListener):  # a helper is reached through its writes; before arm, as in a rank
        Interceptor(checkpoint_dir, [fault]).install()
    process = config.get("process", "helper")
    fault.arm(RankEnvironment(rank=config["rank"], world_size=config["world_size"], checkpoint_dir=checkpoint_dir,
                              clock=FollowedClock(Path(config["clock"])), emit=emit,
                              case_dir=Path(config["case_file"]).parent, process=process,
                              node_index=config.get("node_index", 0)))
    if process == "agent":
        listen_to_persists(fault.agent_persisting)


def follow_forks(fault: Any, checkpoint_dir: Path) -> None:
    """In the rank: a process it forks (megatron-core's writer workers and async save process, which
    fork instead of spawning, so no startup hook runs) is a helper too. The fork keeps the rank's
    clock as it was at the fork (the save it writes for); the first forked generation switches the
    fault to ``process="helper"`` and routes its writes through the interception layer, and forks of
    forks inherit both."""
    def in_child() -> None:
        if fault.env is None or fault.env.process == "helper":
            return
        from ..disk.interception import Interceptor
        from ..faults.base import WriteListener

        fault.env = dataclasses.replace(fault.env, process="helper")
        if isinstance(fault, WriteListener):
            Interceptor(checkpoint_dir, [fault]).install()

    os.register_at_fork(after_in_child=in_child)
