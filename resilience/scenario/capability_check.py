"""What the fault needs against what the strategy offers: one check, at load, for every fault
(`Fault.requires` against `CheckpointStrategy.capabilities_for`), so that no fault finds out in
the ranks that the strategy lacks the method it calls."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..core import registry
from ..core.capabilities import Capability
from ..core.case import MEMORY_COPY, MICRO_STEP, FaultSpec, StrategySpec, WorkloadSpec


def capability_problem(strategy: StrategySpec, fault_kind: str) -> tuple[str, str, str, object] | None:
    """None, or ``(key, problem, value, allowed)`` naming what the fault needs and the built-in
    strategies that offer it."""
    strategy_cls = registry.resolve("strategy", strategy.name)
    missing = registry.resolve("fault", fault_kind).requires - strategy_cls.capabilities_for(strategy.options)
    if not missing:
        return None
    needs = ", ".join(capability.described for capability in Capability if capability in missing)
    if missing <= strategy_cls.capabilities:  # the class has it; these options turn it off
        why = f"which strategy {strategy.name} offers only with other options"
    else:
        why = f"which strategy {strategy.name}{' so configured' if strategy.options else ''} does not offer"
    return ("strategy", f"fault {fault_kind} needs {needs}, {why}", strategy.name,
            offering(frozenset(missing)) or "a plug-in strategy that declares it (package.module:Class)")


def micro_step_problem(strategy: StrategySpec, fault: FaultSpec,
                       workload: WorkloadSpec) -> tuple[str, str, str, object] | None:
    """A fault at point ``micro_step`` needs a loop that accumulates micro-batches and says so
    between them: the strategy's own (`CheckpointStrategy.micro_steps`) or the workload's
    (``workload.options.accumulation``); elsewhere it would never fire."""
    if fault.trigger is None or fault.trigger.point != MICRO_STEP:
        return None
    if registry.resolve("strategy", strategy.name).micro_steps(strategy.options) >= 2:
        return None
    if int(workload.options.get("accumulation", 1)) >= 2:  # a strategy that cannot train it was refused
        return None
    return ("fault.point", f"fires between the micro-batches of a step, and strategy {strategy.name} so configured "
            "trains one micro-batch a step", MICRO_STEP, "workload.options.accumulation >= 2, hf_trainer with "
            "gradient_accumulation_steps >= 2, or point start")


def memory_copy_problem(strategy: StrategySpec, fault: FaultSpec) -> tuple[str, str, str, object] | None:
    """A fault at point ``memory_copy`` needs a strategy that copies state into the node's memory
    and calls back in the middle (``MEMORY_COPY``); elsewhere it would never fire."""
    if fault.trigger is None or fault.trigger.point != MEMORY_COPY:
        return None
    if Capability.MEMORY_COPY in registry.resolve("strategy", strategy.name).capabilities_for(strategy.options):
        return None
    return ("fault.point", f"fires in the middle of a copy into the node's memory, and strategy {strategy.name} "
            f"has no in-memory tier ({Capability.MEMORY_COPY.described})", MEMORY_COPY,
            offering(frozenset({Capability.MEMORY_COPY})) or "a strategy with an in-memory tier")


def node_agent_problem(strategy: StrategySpec, fault: FaultSpec) -> tuple[str, str, str, object] | None:
    """A fault in a node agent (``process: agent``) needs a strategy that keeps one per node
    (``CheckpointStrategy.node_agent``)."""
    if fault.params.get("process") != "agent":
        return None
    if registry.resolve("strategy", strategy.name).node_agent is not None:
        return None
    keeping = [name for name in registry.STRATEGIES if registry.resolve("strategy", name).node_agent is not None]
    return ("fault.process", f"acts in the node agent, and strategy {strategy.name} keeps none", "agent",
            ", ".join(keeping) or "a strategy with node agents")


def workload_option_problem(strategy: StrategySpec, workload: WorkloadSpec) -> tuple[str, str, str, object] | None:
    """A workload option the strategy, so configured, does not train with or save
    (`CheckpointStrategy.workload_options`), or per-rank streams for a library that trains its own
    model: refused by name rather than ignored."""
    strategy_cls = registry.resolve("strategy", strategy.name)
    if strategy_cls.drives_training and workload.rank_rng != "same":
        return ("workload.rank_rng", f"strategy {strategy.name} trains a model of its own, which draws nothing from "
                "the workload's streams", workload.rank_rng, "same (the library's own seeding decides the rest)")
    carried = strategy_cls.workload_options(strategy.options)
    extra = [key for key in workload.options if carried is not None and key not in carried]
    if not extra:
        return None
    return (f"workload.options.{extra[0]}", f"strategy {strategy.name}{' so configured' if strategy.options else ''} "
            "does not train with this option", extra[0], ", ".join(sorted(carried)) or "no workload options")


def verify_saves_problem(strategy: StrategySpec) -> tuple[str, str, str, object] | None:
    """``verify_saves`` restores chosen steps with ``load_step`` outside any training loop: the
    strategy must offer ``CHOSEN_STEP`` and leave training to the harness."""
    strategy_cls = registry.resolve("strategy", strategy.name)
    if Capability.CHOSEN_STEP in strategy_cls.capabilities_for(strategy.options) and not strategy_cls.drives_training:
        return None
    offered = [name for name in offering(frozenset({Capability.CHOSEN_STEP}))
               if not registry.resolve("strategy", name).drives_training]
    return ("verify_saves", f"needs a strategy that restores a chosen step outside its own training loop, which "
            f"strategy {strategy.name} is not", True, offered)


def verify_saves_setting(v: Any, value: Any, strategy: StrategySpec | None, fault: FaultSpec | None) -> bool:
    """``verify_saves`` as given (``true`` refused for a strategy that cannot do it), or by default:
    on where the fault leaves saved files alone and the strategy can restore a chosen step."""
    if strategy is None or fault is None:
        return False
    if value is None:
        return registry.resolve("fault", fault.kind).leaves_saves_alone and not verify_saves_problem(strategy)
    wanted = v.boolean("verify_saves", value)
    problem = verify_saves_problem(strategy) if wanted else None
    if problem:
        raise v.error(*problem)
    return wanted


@lru_cache(maxsize=None)
def offering(needed: frozenset[Capability]) -> tuple[str, ...]:
    """The built-in strategies whose class offers everything in ``needed``. Resolving them imports
    their modules only: none imports its stack's libraries before a rank needs them."""
    return tuple(name for name in registry.STRATEGIES if needed <= registry.resolve("strategy", name).capabilities)
