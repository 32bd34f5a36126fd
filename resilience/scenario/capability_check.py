"""What the fault needs against what the strategy offers: one check, at load, for every fault
(`Fault.requires` against `CheckpointStrategy.capabilities_for`), so that no fault finds out in
the ranks that the strategy lacks the method it calls."""
from __future__ import annotations

from functools import lru_cache

from ..core import registry
from ..core.capabilities import Capability
from ..core.case import MICRO_STEP, FaultSpec, StrategySpec


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


def micro_step_problem(strategy: StrategySpec, fault: FaultSpec) -> tuple[str, str, str, object] | None:
    """A fault at point ``micro_step`` needs a strategy whose loop accumulates micro-batches and
    says so between them (`CheckpointStrategy.micro_steps`); elsewhere it would never fire."""
    if fault.trigger is None or fault.trigger.point != MICRO_STEP:
        return None
    if registry.resolve("strategy", strategy.name).micro_steps(strategy.options) >= 2:
        return None
    return ("fault.point", f"fires between the micro-batches of a step, and strategy {strategy.name} so configured "
            "trains one micro-batch a step", MICRO_STEP, "a strategy that accumulates: hf_trainer with "
            "gradient_accumulation_steps >= 2, or point start")


@lru_cache(maxsize=None)
def offering(needed: frozenset[Capability]) -> tuple[str, ...]:
    """The built-in strategies whose class offers everything in ``needed``. Resolving them imports
    their modules only: none imports its stack's libraries before a rank needs them."""
    return tuple(name for name in registry.STRATEGIES if needed <= registry.resolve("strategy", name).capabilities)
