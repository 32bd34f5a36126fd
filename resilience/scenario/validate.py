"""One case document (a scenario without `matrix`) -> a `Case`, or every problem it has.

Each section (strategy, workload, fault, restart, expect, ...) is checked even when another failed,
as long as it does not build on that one: a file with three mistakes reports all three. Workers
re-parse what the harness sends, so a valid case comes back from its document unchanged.
"""
from __future__ import annotations

import re
from typing import Any

from ..core import registry
from ..core.case import (
    Case,
    Expect,
    FaultSpec,
    KnownIssue,
    Outcome,
    StrategySpec,
    Timeouts,
    Trigger,
    VerdictKind,
    WorkloadSpec,
)
from ..core.events import ClockPhase
from ..core.sizes import parse_size
from ..disk.trace_targets import POINTER, WRITTEN_BY, is_selector, parse_target
from .capability_check import (
    capability_problem,
    memory_copy_problem,
    micro_step_problem,
    node_agent_problem,
    verify_saves_setting,
    workload_option_problem,
)
from .checks import Problems, Validator
from .placement import check_case_software, check_topology
from .schema import (
    DEFAULT_TIMEOUTS,
    EXPECT_KEYS,
    FALLBACK_CHOICES,
    KNOWN_ISSUE_KEYS,
    MAX_TIMEOUT_S,
    MAX_WORLD_SIZE,
    OBJECT_STORES,
    RANK_RNG,
    TIERS,
    TIMEOUT_KEYS,
    TOP_KEYS,
    TRIGGER_KEYS,
    WORKLOAD_KEYS,
)
from .timeline import check_launches


def check_case(document: Any, source: str, case_id: str = "", where: str = "",
               problems: Problems | None = None) -> Case | None:
    """The case, or None with its problems added to ``problems``. Raises only when ``document`` is
    no mapping at all (nothing else can be checked then)."""
    v = Validator(source, where, problems)
    doc = v.mapping("", document, TOP_KEYS)
    if "matrix" in doc:
        v.note(v.error("matrix", "a case document cannot carry a matrix", doc.pop("matrix")))
    name = v.section("name", v.string, "name", doc.get("name"))
    description = name  # optional: a scenario's name often says it all
    if doc.get("description") is not None:
        description = v.section("description", v.string, "description", doc["description"])
    tier = v.section("tier", v.choice, "tier", doc.get("tier", "full"), TIERS)
    strategy = v.section("strategy", check_strategy, v, doc.get("strategy"))
    workload = v.section("workload", check_workload, v, doc.get("workload"))
    topology = fault = restart = None
    timeline: tuple = ()
    if v.ok("workload"):
        model_parallel = registry.resolve("workload", workload.model).model_parallel
        topology = v.section("topology", check_topology, v, "topology",
                             doc.get("topology", {} if model_parallel else None), workload.world_size, workload)
        if v.ok("topology"):
            fault, restart, timeline = check_launches(v, doc, workload, topology, check_fault)
        elif "timeline" not in doc and "soak" not in doc:  # its problems too, beside the topology's
            fault = v.section("fault", check_fault, v, doc.get("fault", {"kind": "none"}), workload)
    if strategy is not None and fault is not None:
        problem = capability_problem(strategy, fault.kind) or micro_step_problem(strategy, fault, workload) \
            or memory_copy_problem(strategy, fault) or node_agent_problem(strategy, fault) \
            or registry.resolve("fault", fault.kind).check_strategy(registry.resolve("strategy", strategy.name))
        if problem:
            v.note(v.error(*problem))
    if strategy is not None and v.ok("workload"):
        problem = workload_option_problem(strategy, workload)
        if problem:
            v.note(v.error(*problem))
    object_store = None
    if doc.get("object_store") is not None:
        object_store = v.section("object_store", v.choice, "object_store", doc["object_store"], OBJECT_STORES)
    if strategy is not None and fault is not None and v.ok("object_store"):
        problem = check_object_store(object_store, strategy, fault)
        if problem:
            v.note(v.error(*problem))
    verify_saves = v.section("verify_saves", verify_saves_setting, v, doc.get("verify_saves"), strategy, fault)
    software = v.section("software", check_case_software, v, doc.get("software"), strategy)
    expect, known_issue, timeouts = check_expectations(v, doc)
    if v.found_any:
        return None
    return Case(id=case_id or "case", source=source, name=name, description=description, tier=tier,
                strategy=strategy, workload=workload, fault=fault, restart=restart, expect=expect,
                known_issue=known_issue, timeouts=timeouts, document=doc, topology=topology,
                object_store=object_store, timeline=timeline, verify_saves=bool(verify_saves),
                software=software)


def check_expectations(v: Validator, doc: dict) -> tuple[Expect | None, KnownIssue | None, Timeouts | None]:
    """A case's ``expect``, ``known_issue`` and ``timeouts`` (each None with its problem noted)."""
    expect = v.section("expect", check_expect, v, doc.get("expect"))
    known_issue = None
    if v.ok("expect"):
        known_issue = v.section("known_issue", check_known_issue, v, doc.get("known_issue"), expect)
    return expect, known_issue, v.section("timeouts", check_timeouts, v, doc.get("timeouts", {}))


FILE_POINTS = ("open", "write", "fsync", "close")  # points of intercepted file writes


def check_object_store(store: str | None, strategy: StrategySpec, fault: FaultSpec) -> tuple | None:
    """Whether the strategy writes to the store and the fault acts on it (or on files)."""
    fault_cls = registry.resolve("fault", fault.kind)
    problem = registry.resolve("strategy", strategy.name).check_object_store(strategy.options, store)
    if problem:
        return problem
    if store is None:
        if fault_cls.needs_object_store:
            return ("object_store", f"missing: a {fault.kind} fault acts on an object store", None,
                    ", ".join(OBJECT_STORES))
        return None
    if fault.trigger is not None and fault.trigger.point in FILE_POINTS:
        return ("fault.point", f"reaches files only; no file is written to {store}", fault.trigger.point,
                "start (or a fault acting after the save)")
    if not fault_cls.on_objects:
        return ("fault.kind", f"acts on files, not on objects in {store}", fault.kind,
                "none, kill at a train step, the s3 fault, or a fault that acts on objects")
    return None


def check_strategy(v: Validator, value: Any) -> StrategySpec:
    if isinstance(value, dict):
        doc = v.mapping("strategy", value, ("name", "options"))
        name, options = doc.get("name"), doc.get("options", {})
        key = "strategy.name"
    else:
        name, options, key = value, {}, "strategy"
    cls = v.plugin("strategy", key, name)
    options = v.plain("strategy.options", v.mapping("strategy.options", options, tuple(cls.options)))
    problem = cls.check_option_values(options)  # the one option validator (a wrapper's inner's too)
    if problem:
        raise v.error(*problem)
    return StrategySpec(name=name, options=options)


def check_workload(v: Validator, value: Any) -> WorkloadSpec:
    doc = v.mapping("workload", v.required("workload", value), WORKLOAD_KEYS)
    model = doc.get("model", "mlp")
    model_parallel = v.plugin("workload", "workload.model", model).model_parallel
    world_size = v.integer("workload.world_size", doc.get("world_size"), 1, MAX_WORLD_SIZE)
    steps = v.integer("workload.steps", doc.get("steps"), 1, 100_000)
    every = v.integer("workload.checkpoint_every", doc.get("checkpoint_every"), 1, steps, f"1..steps ({steps})")
    seed = v.integer("workload.seed", doc.get("seed", 0), 0, 2**31 - 1)
    global_batch = v.integer("workload.global_batch", doc.get("global_batch", 16), 1, 1 << 20)
    if global_batch % world_size and not model_parallel:  # model-parallel: the topology checks dp
        raise v.error("workload.global_batch", f"must be divisible by workload.world_size ({world_size})",
                      global_batch, "a multiple of the world size")
    size = parse_size(doc.get("size", "64KiB"))
    if size is None or size < 1024:
        raise v.error("workload.size", "must be a parameter size of at least 1KiB", doc.get("size"),
                      "bytes as an integer, or a number with KiB, MiB, GiB (KB, MB, GB)")
    rank_rng = v.choice("workload.rank_rng", doc.get("rank_rng", "same"), RANK_RNG)
    options = doc.get("options", {})
    options = v.plain("workload.options", v.mapping(
        "workload.options", options, tuple(options) if isinstance(options, dict) else ()))
    problem = registry.resolve("workload", model).check_options(options, world_size, global_batch)
    if problem:
        raise v.error(*problem)
    return WorkloadSpec(model=model, world_size=world_size, steps=steps, checkpoint_every=every, seed=seed,
                        global_batch=global_batch, size_bytes=size, rank_rng=rank_rng, options=options)


def check_fault(v: Validator, value: Any, workload: WorkloadSpec) -> FaultSpec:
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict):
        raise v.error("fault", "must be a mapping with a kind", value, list(registry.FAULTS))
    cls = v.plugin("fault", "fault.kind", value.get("kind"))
    doc = v.mapping("fault", value, ("kind",) + (TRIGGER_KEYS if cls.needs_trigger else ()) + tuple(cls.params))
    params = {}
    for key, (allowed, default) in cls.params.items():
        if allowed is float:
            params[key] = v.number(f"fault.{key}", v.required(f"fault.{key}", doc.get(key, default)), 0)
        elif allowed is object:  # any JSON value or absent (None); the fault's check() validates it
            params[key] = v.plain(f"fault.{key}", doc.get(key, default))
        elif allowed is str:  # an optional glob or name, of files under the checkpoint directory
            glob = doc.get(key, default)
            params[key] = glob if glob is None else check_file(v, f"fault.{key}", glob, cls, workload.world_size)
        else:
            params[key] = v.choice(f"fault.{key}", doc.get(key, default), allowed)
    trigger = check_trigger(v, doc, workload, cls) if cls.needs_trigger else None
    spec = FaultSpec(kind=doc["kind"], trigger=trigger, params=params)
    problem = cls.check(spec)
    if problem:
        raise v.error(*problem)
    return spec


def check_trigger(v: Validator, doc: dict, workload: WorkloadSpec, cls: type) -> Trigger:
    if cls.needs_rank:
        rank = v.integer("fault.rank", doc.get("rank"), 0, workload.world_size - 1,
                         f"0..{workload.world_size - 1} ({workload.world_size_key} is {workload.world_size})")
    elif "rank" in doc:
        raise v.error("fault.rank", f"a {cls.kind} fault hits every rank at once; leave rank out", doc["rank"])
    else:
        rank = 0
    phase = v.choice("fault.phase", doc.get("phase", "save"), tuple(cls.points))
    step = v.integer("fault.step", doc.get("step"), 1, workload.steps, f"1..{workload.steps}")
    if phase == ClockPhase.SAVE and step not in workload.checkpoint_steps:
        raise v.error("fault.step", "no checkpoint is saved at this step", step,
                      ", ".join(map(str, workload.checkpoint_steps)))
    after_bytes = doc.get("after_bytes")
    if after_bytes is not None:
        after_bytes = parse_size(after_bytes)
        if after_bytes is None:
            raise v.error("fault.after_bytes", "must be a byte offset", doc.get("after_bytes"),
                          "an integer >= 0 or a size such as 4KiB")
    default_point = "write" if after_bytes is not None and "write" in cls.points[phase] else cls.points[phase][0]
    point = v.choice("fault.point", doc.get("point", default_point), cls.points[phase])
    if point == "write" and after_bytes is None and "write" in cls.byte_points:
        raise v.error("fault.after_bytes", "missing: point 'write' needs a byte offset")
    if after_bytes is not None and point not in cls.byte_points:
        raise v.error("fault.after_bytes", f"has no meaning at point {point!r}", after_bytes,
                      f"points {', '.join(cls.byte_points)}")
    file = check_file(v, "fault.file", doc.get("file", "*"), cls, workload.world_size)
    return Trigger(rank=rank, step=step, phase=phase, point=point, file=file, after_bytes=after_bytes)


def check_file(v: Validator, key: str, value: Any, cls: type, world_size: int) -> str:
    """A glob of files under the checkpoint directory, or a target the run's IO trace resolves
    (`resilience.disk.trace_targets`) where the fault takes one."""
    if not is_selector(value):
        return v.relative_glob(key, value)
    try:
        target = parse_target(value, world_size)
    except ValueError as exc:
        raise v.error(key, "names no target of the IO trace", value, str(exc)) from None
    takes = cls.trace_targets
    if target.kind not in takes:
        forms = {"written_by": WRITTEN_BY + "R", "pointer": POINTER}
        allowed = [forms[t] for t in takes] or "a glob relative to the checkpoint directory"
        raise v.error(key, f"a {cls.kind} fault cannot take {value!r} from the IO trace", value, allowed)
    return value


def check_expect(v: Validator, value: Any) -> Expect:
    allowed = [o.value for o in Outcome]
    doc = {"outcome": value} if isinstance(value, str) or value is None else value
    doc = v.mapping("expect", doc, EXPECT_KEYS)
    outcome = Outcome(v.choice("expect.outcome" if isinstance(value, dict) else "expect",
                               doc.get("outcome"), tuple(allowed)))
    error = doc.get("error")
    if error is not None:
        if outcome is not Outcome.FAILS_LOUDLY:
            raise v.error("expect.error", "an error pattern needs outcome fails_loudly", error)
        if not isinstance(error, str):
            raise v.error("expect.error", "must be a regular expression string", error)
        try:
            re.compile(error)
        except re.error as exc:
            raise v.error("expect.error", f"not a valid regular expression: {exc}", error) from None
    fallback_ok = v.boolean("expect.fallback_ok", doc.get("fallback_ok", False))
    fallback = v.choice("expect.fallback", doc.get("fallback", "optional"), FALLBACK_CHOICES)
    return Expect(outcome=outcome, error=error, fallback_ok=fallback_ok, fallback_required=fallback == "required")


def check_known_issue(v: Validator, value: Any, expect: Expect) -> KnownIssue | None:
    if value is None:
        return None
    doc = v.mapping("known_issue", value, KNOWN_ISSUE_KEYS)
    verdicts = tuple(kind.value for kind in VerdictKind)
    verdict = VerdictKind(v.choice("known_issue.verdict", doc.get("verdict"), verdicts))
    # LOUD beside LOUD pins a refusal where `expect.fallback: required` (an older step was intact)
    if verdict is expect.verdict and not (verdict is VerdictKind.LOUD and expect.fallback_required):
        raise v.error("known_issue.verdict", "must differ from the expected verdict (LOUD may pin a refusal "
                      "only with expect.fallback: required)", verdict.value,
                      [kind for kind in verdicts if kind != expect.verdict.value])
    return KnownIssue(reason=v.string("known_issue.reason", doc.get("reason")),
                      link=v.string("known_issue.link", doc.get("link")), verdict=verdict)


def check_timeouts(v: Validator, value: Any) -> Timeouts:
    doc = v.mapping("timeouts", value, TIMEOUT_KEYS)
    merged = {**DEFAULT_TIMEOUTS, **doc}
    collective = v.number("timeouts.collective", merged["collective"], 0, MAX_TIMEOUT_S)
    phase = v.number("timeouts.phase", merged["phase"], 0, MAX_TIMEOUT_S)
    return Timeouts(collective_s=collective, phase_s=phase)
