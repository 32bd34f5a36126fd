"""The checks behind `CheckpointStrategy`'s declarations: that a class's declared capabilities
match the methods it overrides (at class creation), and that a scenario's options are ones the
strategy declares (at load, for the scenario validator and for a wrapper's inner options alike)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.capabilities import Capability

OPTIONS_KEY = "strategy.options"  # where a strategy's own options sit in a scenario
#: class attributes of earlier releases, now declared otherwise: what a class defining one must do
RENAMED = {"records_version": "declare Capability.VERSION_STAMP in capabilities instead"}


def declaration_problems(cls: type, base: type) -> list[str]:
    """What is wrong with the capabilities ``cls`` (a subclass of ``base``) declares: a declared
    capability whose methods it does not override, a method it overrides without declaring its
    capability (unless it answers ``capabilities_for`` itself, as a wrapper that forwards does)."""
    below = cls.__mro__[:cls.__mro__.index(base)]  # the classes between cls and the base, mixins too

    def overrides(name: str) -> bool:
        return any(name in vars(klass) for klass in below)

    problems = []
    for capability in Capability:
        overridden = [m for m in capability.methods if overrides(m)]
        if capability in cls.capabilities:
            missing = [m for m in capability.methods if m not in overridden]
            if missing:
                problems.append(f"declares Capability.{capability.name} but does not override "
                                + ", ".join(missing))
        elif overridden and not overrides("capabilities_for"):
            problems.append(f"overrides {', '.join(overridden)} without declaring Capability.{capability.name} "
                            "in capabilities")
    for name, instead in RENAMED.items():
        if name in vars(cls):
            problems.append(f"sets {name}: {instead}")
    if "saves_on_sigterm" in vars(cls) and not callable(vars(cls)["saves_on_sigterm"]):
        problems.append("sets saves_on_sigterm to a value: it is a method (def saves_on_sigterm(self) -> bool)")
    return problems


def option_problem(cls: type, options: Any, prefix: str = OPTIONS_KEY) -> tuple[str, str, Any, Any] | None:
    """The first problem of ``options`` for strategy class ``cls`` as ``(key, problem, value,
    allowed)``, keys under ``prefix``; None when they are valid."""
    from ..scenario.checks import did_you_mean
    from ..scenario.schema import MAX_WORLD_SIZE

    declared = tuple(cls.options)
    if not isinstance(options, Mapping):
        return (prefix, "must be a mapping", options, declared or "none")
    for option, value in options.items():
        key = f"{prefix}.{option}"
        if option not in declared:
            return (key, f"unknown key{did_you_mean(option, declared)}", option, declared or "none")
        allowed = cls.option_values.get(option)
        if allowed is int:  # a count, such as ranks per write wave
            counts = f"1..{MAX_WORLD_SIZE}"
            if isinstance(value, bool) or not isinstance(value, int):
                return (key, "must be an integer", value, counts)
            if not 1 <= value <= MAX_WORLD_SIZE:
                return (key, "out of range", value, counts)
        elif allowed is not None and (value is None or value not in allowed):
            problem = "missing required key" if value is None else "not one of the allowed values"
            return (key, problem + did_you_mean(value, allowed), value, allowed)
    problem = cls.check_options(options)
    if problem and prefix != OPTIONS_KEY:  # the strategy names its keys as a scenario's own options
        key, *rest = problem
        return (prefix + key.removeprefix(OPTIONS_KEY) if key.startswith(OPTIONS_KEY) else key, *rest)
    return problem
