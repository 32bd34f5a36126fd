"""Cases on a user's own script (black-box mode): a scenario file whose ``script`` section replaces
``strategy`` and ``workload``, checked by the scenario validator's own rules (fault, expect,
known_issue, timeouts, matrix) against what is known of a script before it runs.

    script:
      path: train.py                # relative to the scenario file
      args: [--out, "{checkpoint_dir}"]
      restart_args: [--out, "{checkpoint_dir}", --resume]   # optional: the restart's own (and a
                                    # timeline's later launches' unless one gives its own args)
      nproc_per_node: 2
      nnodes: 2                     # optional: nodes on this machine, each a network namespace (root)
      restart_nproc_per_node: 1     # optional: the restart at another world size (not judged bitwise)
      continuation_args: [--out, "{checkpoint_dir}", --resume]  # optional: ... unless its losses have
                                    # an oracle: the job resumed there from an uninterrupted run's save
      env: {NAME: value}
      oracle: bitwise               # or envelope (a script that is not reproducible), with
      references: 2                 # uninterrupted runs (envelope: 3) and envelope_factor: 2

``timeline`` (in place of ``fault``) relaunches the job several times, each launch from the
checkpoints of those before it, every one at the first run's size:

    timeline:
      - fault: {kind: kill, rank: 1, step: 6}      # the first run, with script.args
      - fault: {kind: kill, rank: 0, step: 6}      # its own 6th step: a script says not which it restored
        args: [--out, "{checkpoint_dir}", --resume]
      - {}                                         # the last runs to the end (script.restart_args)

A script offers nothing through the framework's API, so only faults that need nothing from it
are available (`script_faults`; each fault says why not: ``Fault.script_problem``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..core import registry
from ..core.case import MEMORY_COPY, MICRO_STEP, FaultSpec
from ..core.script_case import ScriptCase, ScriptLaunch, ScriptSpec
from .checks import Problems, Validator
from .matrix import expand_cases
from .schema import MAX_WORLD_SIZE, TIERS
from .timeline import MAX_LAUNCHES
from .validate import check_expectations, check_fault

MAX_NODES = 4  # each a network namespace with an agent of its own, on this machine

SCRIPT_TOP_KEYS = ("name", "description", "tier", "script", "fault", "timeline", "expect", "known_issue", "timeouts",
                   "matrix")
SCRIPT_KEYS = ("path", "args", "restart_args", "nproc_per_node", "nnodes", "restart_nproc_per_node",
               "continuation_args", "max_restarts", "env", "oracle", "references", "envelope_factor")
ORACLES = ("bitwise", "envelope")

@dataclass(frozen=True)
class ScriptBounds:
    """What a trigger on a script is checked against: its world size. Its steps and the steps it
    saves at are known only once it ran: any step from 1 may be named (a fault whose step the
    script never reaches says so: ``fault_missed``, or no ``fault_fired``)."""

    world_size: int
    steps: int = 1_000_000
    #: where an error points for the rank's range
    world_size_key: ClassVar[str] = "script.nproc_per_node x script.nnodes"

    @property
    def checkpoint_steps(self) -> range:
        return range(1, self.steps + 1)


def script_faults() -> tuple[str, ...]:
    """The registered faults a script can be put under, in registry order."""
    return tuple(name for name in registry.FAULTS if registry.resolve("fault", name).script_problem() is None)


def check_script_fault(document: Any, source: str, world_size: int, nnodes: int = 1) -> FaultSpec:
    """The fault, checked as a scenario's is; errors name ``source``, the key, the bad value and
    what is allowed."""
    problems = Problems(source)
    v = Validator(source, "", problems)
    spec = v.section("fault", _checked_fault, v, {"kind": "none"} if document is None else document, world_size,
                     nnodes)
    problems.raise_any()
    return spec

def is_script_document(document: Any) -> bool:
    """Whether a scenario document describes a script (its ``script`` section) rather than a strategy."""
    return isinstance(document, dict) and "script" in document


def load_script_document(document: dict, source: str) -> tuple[ScriptCase, ...]:
    """Every case of a script scenario, or one `ScenarioError` listing each problem of every case."""
    problems = Problems(source)
    doc = Validator(source, problems=problems).mapping("", document, SCRIPT_TOP_KEYS)
    return tuple(expand_cases(source, doc, SCRIPT_TOP_KEYS, problems, check_script_case))


def check_script_case(doc: dict, source: str, case_id: str, where: str, problems: Problems) -> ScriptCase | None:
    v = Validator(source, where, problems)
    name = v.section("name", v.string, "name", doc.get("name"))
    description = v.section("description", v.string, "description", doc["description"]) \
        if doc.get("description") is not None else name
    tier = v.section("tier", v.choice, "tier", doc.get("tier", "full"), TIERS)
    script = v.section("script", check_script, v, doc.get("script"), Path(source).parent)
    fault, timeline = None, ()
    if script is not None and "timeline" in doc:
        fault, timeline = v.section("timeline", _checked_timeline, v, doc, script) or (None, ())
    elif script is not None:
        fault = v.section("fault", _checked_fault, v, doc.get("fault", {"kind": "none"}),
                          script.nproc_per_node * script.nnodes, script.nnodes)
    if fault is not None and fault.trigger is not None and script.restart_nproc_per_node is not None \
            and registry.resolve("fault", fault.kind).arms_at_restart \
            and fault.trigger.rank >= script.restart_nproc_per_node * script.nnodes:
        v.section("fault.rank", _refuse, v, fault.trigger.rank, script.restart_nproc_per_node * script.nnodes)
    expect, known_issue, timeouts = check_expectations(v, doc)
    if v.found_any:
        return None
    return ScriptCase(id=case_id or "case", source=source, name=name, description=description, tier=tier,
                      script=script, fault=fault, expect=expect, known_issue=known_issue, timeouts=timeouts,
                      timeline=timeline)


def check_script(v: Validator, value: Any, directory: Path) -> ScriptSpec:
    doc = v.mapping("script", v.required("script", value), SCRIPT_KEYS)
    path = directory / v.string("script.path", v.required("script.path", doc.get("path")))
    if not path.is_file():
        raise v.error("script.path", f"no such file (relative to {directory})", doc.get("path"))
    args = _strings(v, "script.args", doc.get("args", []))
    restart_args = None if doc.get("restart_args") is None else _strings(v, "script.restart_args", doc["restart_args"])
    nproc = v.integer("script.nproc_per_node", doc.get("nproc_per_node", 2), 1, MAX_WORLD_SIZE)
    nnodes = v.integer("script.nnodes", doc.get("nnodes", 1), 1, MAX_NODES)
    restart_nproc = None if doc.get("restart_nproc_per_node") is None else v.integer(
        "script.restart_nproc_per_node", doc["restart_nproc_per_node"], 1, MAX_WORLD_SIZE)
    continuation = None if doc.get("continuation_args") is None else _strings(v, "script.continuation_args",
                                                                                doc["continuation_args"])
    if continuation is not None and restart_nproc in (None, nproc):
        raise v.error("script.continuation_args", "resumes a restart at another world size, and the restart has "
                      "the first run's", doc["continuation_args"],
                      "script.restart_nproc_per_node other than script.nproc_per_node, or leave it out")
    restarts = v.integer("script.max_restarts", doc.get("max_restarts", 1), 0, 10)
    env = v.mapping("script.env", doc.get("env", {}), tuple(doc.get("env", {}) or ()))
    for key, item in env.items():
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise v.error(f"script.env.{key}", "must be a string or a number", item)
    oracle = v.choice("script.oracle", doc.get("oracle", "bitwise"), ORACLES)
    references = v.integer("script.references", doc.get("references", 3 if oracle == "envelope" else 2),
                           2 if oracle == "envelope" else 1, 20)
    factor = v.number("script.envelope_factor", doc.get("envelope_factor", 2.0), 1.0, 100.0)
    if oracle == "bitwise" and "envelope_factor" in doc:
        raise v.error("script.envelope_factor", "has no meaning with oracle bitwise", doc["envelope_factor"])
    return ScriptSpec(path=str(path.resolve()), args=args, restart_args=restart_args, nproc_per_node=nproc,
                      nnodes=nnodes,
                      restart_nproc_per_node=restart_nproc, continuation_args=continuation,
                      max_restarts=restarts, env={key: str(item) for key, item in env.items()}, oracle=oracle,
                      references=references, envelope_factor=factor)


def _checked_timeline(v: Validator, doc: dict, script: ScriptSpec) -> tuple[FaultSpec, tuple[ScriptLaunch, ...]]:
    """The first run's fault and each later launch of a script's ``timeline``: every launch at the
    first run's size, each with ``args`` (the first: ``script.args``; later: ``script.restart_args``,
    else ``script.args``) and a fault that acts from its trigger alone; the last has none."""
    value = doc["timeline"]
    if "fault" in doc:
        raise v.error("fault", "beside a timeline: each launch's fault goes in its entry", doc["fault"],
                      "timeline.0.fault")
    for key in ("restart_nproc_per_node", "continuation_args"):
        if getattr(script, key) is not None:
            raise v.error(f"script.{key}", "changes the restart's size, and every launch of a script's timeline "
                          "runs at the first run's", getattr(script, key), "leave it out")
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_LAUNCHES:
        raise v.error("timeline", f"must list 2 to {MAX_LAUNCHES} launches of the job, the first run first", value,
                      "e.g. [{fault: {kind: kill, rank: 1, step: 6}}, {args: [..., --resume]}]")
    ranks, launches = script.nproc_per_node * script.nnodes, []
    for index, entry in enumerate(value):
        where = f"timeline.{index}"
        # the first run's arguments are script.args, which its reference runs
        entry = v.mapping(where, entry if entry is not None else {}, ("fault", "args") if index else ("fault",))
        fault = _checked_fault(v.rerooted({"fault": f"{where}.fault"}), entry.get("fault", {"kind": "none"}), ranks,
                               script.nnodes)
        fault_class = registry.resolve("fault", fault.kind)
        if index and not fault_class.in_timelines:
            allowed = [name for name in script_faults() if registry.resolve("fault", name).in_timelines]
            raise v.error(f"{where}.fault.kind", "cannot be armed in a later launch (it needs the first run's setup, "
                          "heal or findings)", fault.kind, allowed)
        if not index and fault_class.explores:
            raise v.error(f"{where}.fault.kind", "explores crash states with restarts of its own", fault.kind,
                          "a fault without a timeline, or another fault")
        if index == len(value) - 1 and fault.kind != "none":
            raise v.error(f"{where}.fault", "the last launch runs the job to its end: it has no fault", fault.kind,
                          "none (add a launch after it)")
        default = script.args if not index else script.restart_args or script.args
        args = _strings(v, f"{where}.args", entry["args"]) if "args" in entry else default
        launches.append(ScriptLaunch(fault=fault, args=args))
    return launches[0].fault, tuple(launches[1:])


def _refuse(v: Validator, rank: int, ranks: int) -> None:
    raise v.error("fault.rank", f"this fault acts in the restart, which has {ranks} ranks "
                  "(script.restart_nproc_per_node x script.nnodes)", rank, f"0..{ranks - 1}")


def _strings(v: Validator, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, (str, int, float)) for item in value):
        raise v.error(key, "must be a list of command-line arguments", value, "a list of strings")
    return tuple(str(item) for item in value)


def _checked_fault(v: Validator, value: Any, world_size: int, nnodes: int = 1) -> FaultSpec:
    kind = value.get("kind") if isinstance(value, dict) else value
    fault_class = v.plugin("fault", "fault.kind", kind) if isinstance(kind, str) else None
    problem = fault_class.script_problem() if fault_class is not None else None
    if problem:
        raise v.error("fault.kind", f"not available on a user's script: {problem}", kind, script_faults())
    if fault_class is not None and fault_class.acts_in_its_node and nnodes < 2:
        raise v.error("fault.kind", "loses a whole node, and the script runs on one", kind,
                      "script.nnodes: 2 or more, or another fault")
    if fault_class is not None and fault_class.joins_rank_namespaces and nnodes > 1:
        raise v.error("fault.kind", "puts ranks in network namespaces of their own, and a script's nodes are "
                      "namespaces already", kind, "script.nnodes: 1, or another fault")
    fault = check_fault(v, value, ScriptBounds(world_size))
    if fault.params.get("local_storage") == "lost":
        raise v.error("fault.local_storage", "takes a node's local disk, and a script's checkpoint directory is "
                      "shared by its nodes", "lost", "kept")
    if fault.params.get("scope") == "node" and fault_class.joins_rank_namespaces:
        raise v.error("fault.scope", "cuts off a node, and a script's ranks all run on this one", "node", "rank")
    if fault.params.get("scope") == "node" and nnodes > 1:
        raise v.error("fault.scope", "acts on the trigger rank's node, and a script's nodes are not placed for it "
                      "(one node: every rank)", "node", "rank, or script.nnodes: 1")
    if fault.trigger is not None and fault.trigger.point == MICRO_STEP:
        raise v.error("fault.point", "fires between the micro-batches of a step, which a script does not report",
                      MICRO_STEP, "start")
    if fault.trigger is not None and fault.trigger.point == MEMORY_COPY:
        raise v.error("fault.point", "fires inside a strategy's copy into memory, and a script offers no strategy",
                      MEMORY_COPY, "start")
    if fault.params.get("process") == "agent":
        raise v.error("fault.process", "acts in a node agent the harness keeps for a strategy, and a script's "
                      "ranks have none", "agent", "rank, helper")
    return fault
