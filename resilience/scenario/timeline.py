"""A scenario's ``timeline``: the launches of one job, each from the checkpoints of those before it.

    timeline:
      - fault: {kind: kill, rank: 1, step: 6}        # the first run (its placement: workload, topology)
      - fault: {kind: kill, rank: 0, step: 10}       # the restart: restores, trains, is killed again
      - {}                                           # the last launch runs the job to its end

Entry 0 holds only the first run's ``fault``; every later entry the keys of ``restart`` and a
``fault`` of its own. ``fault`` and ``restart`` beside a timeline are refused: ``restart:`` is the
short form of a two-entry timeline. A later launch's fault must be one that acts from its trigger
alone (``Fault.in_timelines``), and the last launch has none, so the job reaches its end. Every
launch runs at the first run's parallel layout and software: its oracle is the reference.
"""
from __future__ import annotations

from typing import Any

from ..core import registry
from ..core.case import FaultSpec, Incarnation, RestartSpec, WorkloadSpec
from ..core.topology import Topology
from .checks import Validator
from .placement import check_restart
from .schema import RESTART_KEYS

MAX_LAUNCHES = 16


def check_timeline(v: Validator, value: Any, workload: WorkloadSpec, topology: Topology | None, check_fault
                   ) -> tuple[FaultSpec, RestartSpec, tuple[Incarnation, ...]]:
    """The first run's fault, the restart, and every launch after the first run. ``check_fault``:
    the validator's check of one ``fault`` section (`validate.check_fault`)."""
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_LAUNCHES:
        raise v.error("timeline", f"must list 2 to {MAX_LAUNCHES} launches of the job, the first run first",
                      value, "e.g. [{fault: {kind: kill, rank: 1, step: 6}}, {fault: ...}, {}]")
    first_doc = v.mapping("timeline.0", value[0] if value[0] is not None else {}, ("fault",))
    first_fault = check_fault(v.rerooted({"fault": "timeline.0.fault"}), first_doc.get("fault", {"kind": "none"}),
                              workload)
    if registry.resolve("fault", first_fault.kind).explores and len(value) > 2:
        raise v.error("timeline.0.fault.kind", "explores crash states with restarts of its own: it ends a "
                      "two-launch case", first_fault.kind, "a timeline of 2 launches, or another fault")
    first = topology or Topology.single_node(workload.world_size)
    later = []
    for index, entry in enumerate(value[1:], 1):
        where = f"timeline.{index}"
        doc = v.mapping(where, entry if entry is not None else {}, RESTART_KEYS + ("fault",))
        sub = v.rerooted({"restart": where, "fault": f"{where}.fault"})
        restart = check_restart(sub, {k: doc[k] for k in doc if k != "fault"}, workload, topology)
        fault = check_fault(sub, doc.get("fault", {"kind": "none"}), workload)
        fault_class = registry.resolve("fault", fault.kind)
        if not fault_class.in_timelines:
            allowed = sorted(name for name in registry.FAULTS if registry.resolve("fault", name).in_timelines)
            raise v.error(f"{where}.fault.kind", "cannot be armed in a later launch (it needs the first run's "
                          "setup, heal or findings)", fault.kind, allowed)
        if index == len(value) - 1 and fault.kind != "none":
            raise v.error(f"{where}.fault", "the last launch runs the job to its end: it has no fault",
                          fault.kind, "none (add a launch after it)")
        if restart.placement.parallel != first.parallel or restart.python or restart.packages:
            raise v.error(where, "every launch of a timeline runs at the first run's parallel layout and "
                          "software (its oracle is the reference)", {k: doc[k] for k in doc if k != "fault"},
                          f"world_size {workload.world_size}, rank_map, a placement with {first.describe()}")
        later.append(Incarnation(restart=restart, fault=fault))
    return first_fault, later[0].restart, tuple(later)
