"""A scenario's ``timeline``: the launches of one job, each from the checkpoints of those before it;
and ``soak``, a timeline drawn from a seed.

    timeline:
      - fault: {kind: kill, rank: 1, step: 6}        # the first run (its placement: workload, topology)
      - fault: {kind: kill, rank: 0, step: 10}       # the restart: restores, trains, is killed again
      - {}                                           # the last launch runs the job to its end

Entry 0 holds only the first run's ``fault``; every later entry the keys of ``restart`` and a
``fault`` of its own. ``fault`` and ``restart`` beside a timeline are refused: ``restart:`` is the
short form of a two-entry timeline. A later launch's fault must be one that acts from its trigger
alone (``Fault.in_timelines``), and the last launch has none, so the job reaches its end. A launch
may run at another world size, topology or software (each defaults to the first run's, as the
restart's do): it is judged by a continuation of the trusted state it restored, at its own layout
and software (`resilience.run.oracle_chain`).

    soak: {failures: 4, every: [2, 5], kinds: [kill, crash, preempt], seed: 7}

draws ``failures`` faults in training, each ``every`` steps (inclusive bounds) after the one before
it, of a kind, on a rank, from ``random.Random(seed)``: the same file gives the same schedule,
which the case's document then holds as a plain timeline (replayable as it is).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

from ..core import registry
from ..core.case import FaultSpec, Incarnation, RestartSpec, WorkloadSpec
from ..core.topology import Topology
from .checks import Validator
from .placement import check_restart
from .schema import RESTART_KEYS

MAX_LAUNCHES = 16


@dataclass(frozen=True)
class LaunchWorkload(WorkloadSpec):
    """The workload as one launch of a timeline runs it, for checking that launch's fault: its
    ranks are the launch's, and an error about them names the launch's world size."""
    launch: str = "timeline.1"

    @property
    def world_size_key(self) -> str:  # per launch, where the base names it once per class
        return f"{self.launch}.world_size"

    @classmethod
    def of(cls, workload: WorkloadSpec, world_size: int, launch: str) -> LaunchWorkload:
        """``workload`` at ``world_size``, as launch ``launch`` (``timeline.K``) runs it."""
        same = {f.name: getattr(workload, f.name) for f in fields(workload)}
        return cls(**{**same, "world_size": world_size}, launch=launch)
SOAK_KEYS = ("failures", "every", "kinds", "seed")
# each kind's fault in training; preempt's grace is short, as a scheduler's is
SOAK_FAULTS = {"kill": {}, "crash": {"how": "os_exit"}, "preempt": {"grace": 10}}


def draw_soak(v: Validator, value: Any, workload: WorkloadSpec) -> list[dict]:
    """The timeline a ``soak`` section draws (entries as a scenario writes them)."""
    doc = v.mapping("soak", value, SOAK_KEYS)
    failures = v.integer("soak.failures", v.required("soak.failures", doc.get("failures")), 1, MAX_LAUNCHES - 1)
    every = doc.get("every", [1, max(1, workload.steps // (failures + 1))])
    if (not isinstance(every, list) or len(every) != 2 or not all(isinstance(n, int) and not isinstance(n, bool)
                                                                   for n in every) or not 1 <= every[0] <= every[1]):
        raise v.error("soak.every", "must be [fewest, most] steps between failures", every, "e.g. [2, 5]")
    kinds = doc.get("kinds", ["kill"])
    if not isinstance(kinds, list) or not kinds or any(kind not in SOAK_FAULTS for kind in kinds):
        raise v.error("soak.kinds", "must list fault kinds a soak draws from", kinds, list(SOAK_FAULTS))
    seed = v.integer("soak.seed", doc.get("seed", 0), 0)
    draw = random.Random(seed)
    entries, step = [], 0
    for _ in range(failures):
        step += draw.randint(*every)
        kind = draw.choice(kinds)
        entries.append({"fault": {"kind": kind, "rank": draw.randrange(workload.world_size), "step": step,
                                  "phase": "train", **SOAK_FAULTS[kind]}})
    if step >= workload.steps:
        raise v.error("soak.failures", f"with seed {seed}, failures every {every[0]}..{every[1]} steps reach step "
                      f"{step}, past the job's last step but one ({workload.steps - 1})", failures,
                      "fewer failures, a smaller soak.every, or more workload.steps")
    return [*entries, {}]


def check_launches(v: Validator, doc: dict, workload: WorkloadSpec, topology: Topology | None, check_fault
                   ) -> tuple[FaultSpec | None, RestartSpec | None, tuple[Incarnation, ...]]:
    """A case's launches from its ``fault`` and ``restart``, its ``timeline`` or its ``soak`` (each
    None, with its problem noted): the first run's fault, the restart, and the timeline (empty for
    the short form). A drawn soak replaces ``soak`` in ``doc`` with its timeline."""
    if "soak" in doc:
        if "timeline" in doc:
            v.note(v.error("timeline", "beside a soak, which draws the timeline", doc.pop("timeline"), "one of them"))
        drawn = v.section("soak", draw_soak, v, doc.pop("soak"), workload)
        if drawn is None:
            return None, None, ()
        doc["timeline"] = drawn  # the case's document holds the schedule: it replays as it is
    if "timeline" not in doc:
        fault = v.section("fault", check_fault, v, doc.get("fault", {"kind": "none"}), workload)
        return fault, v.section("restart", check_restart, v, doc.get("restart", {}), workload, topology), ()
    for beside in ("fault", "restart"):
        if beside in doc:
            v.note(v.error(beside, "beside a timeline: each launch's fault and placement go in its entry",
                           doc.pop(beside), "timeline.0.fault" if beside == "fault" else "timeline.1"))
    return v.section("timeline", check_timeline, v, doc["timeline"], workload, topology, check_fault) \
        or (None, None, ())


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
    acts_at_restart = registry.resolve("fault", first_fault.kind).arms_at_restart
    later = []
    for index, entry in enumerate(value[1:], 1):
        where = f"timeline.{index}"
        doc = v.mapping(where, entry if entry is not None else {}, RESTART_KEYS + ("fault",))
        sub = v.rerooted({"restart": where, "fault": f"{where}.fault"})
        restart = check_restart(sub, {k: doc[k] for k in doc if k != "fault"}, workload, topology)
        # a fault's rank is one of this launch's
        launch = LaunchWorkload.of(workload, restart.world_size, where)
        fault = check_fault(sub, doc.get("fault", {"kind": "none"}), launch)
        fault_class = registry.resolve("fault", fault.kind)
        if not fault_class.in_timelines:
            allowed = sorted(name for name in registry.FAULTS if registry.resolve("fault", name).in_timelines)
            raise v.error(f"{where}.fault.kind", "cannot be armed in a later launch (it needs the first run's "
                          "setup, heal or findings)", fault.kind, allowed)
        if fault.params.get("process") == "agent":  # the harness arms the first run's agents only
            raise v.error(f"{where}.fault.process", "acts in a node agent, which is armed in the first launch only",
                          "agent", "rank, helper (or the first launch's fault)")
        if index == 1 and acts_at_restart and fault.kind != "none":
            raise v.error(f"{where}.fault", f"the first run's {first_fault.kind} fault acts in the restart too: the "
                          "restart can have no fault of its own", fault.kind, "none")
        if index == len(value) - 1 and fault.kind != "none":
            raise v.error(f"{where}.fault", "the last launch runs the job to its end: it has no fault",
                          fault.kind, "none (add a launch after it)")
        later.append(Incarnation(restart=restart, fault=fault))
    return first_fault, later[0].restart, tuple(later)
