"""`resilience list strategies|faults|workloads`: every built-in plug-in, its options and one line of doc.

Everything shown is read from the plug-in classes themselves (docstrings, ``options``,
``option_values``, ``params``, ``points``, ``requires``), so the listing cannot drift from the code.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

from ..core import registry
from ..scenario.loader import TRIGGER_KEYS

KINDS = {"strategies": "strategy", "faults": "fault", "workloads": "workload"}


@dataclass(frozen=True)
class Entry:
    name: str
    target: str  # package.module:Class
    summary: str  # the first sentence of the class docstring
    settings: tuple[str, ...]  # "key: allowed values (default)" lines
    unavailable: str | None  # why it cannot run here (a missing library), or None


def first_sentence(cls: type) -> str:
    """The first sentence of the class's own docstring, else of its module's (a subclass that only
    sets a constant, such as a ZeRO stage, is documented by its module)."""
    import sys

    def lead(doc: str) -> str:
        return " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split()).replace("``", "")

    paragraph = lead(cls.__dict__.get("__doc__") or "")
    if not paragraph or paragraph.endswith(":"):  # empty, or it introduces a list
        paragraph = lead(sys.modules[cls.__module__].__doc__ or inspect.getdoc(cls) or "")
    end = re.search(r"(?<!\be\.g)(?<!\bi\.e)\. ", paragraph)  # "e.g." and "i.e." end no sentence
    return paragraph if end is None else paragraph[:end.start() + 1]


def _describe_allowed(allowed) -> str:
    if allowed is float:
        return "a number > 0"
    if allowed is str:
        return "a file name or glob"
    if allowed is int:
        return "an integer >= 1"
    if allowed is object:  # a number, a word or a fraction: the fault's own check says which
        return "a value the fault checks (see its description)"
    return " | ".join(map(str, allowed))


def _strategy_settings(cls: type) -> tuple[str, ...]:
    values = dict(cls.option_values)
    return tuple(f"options.{name}: {_describe_allowed(values[name]) if name in values else 'any'}"
                 for name in cls.options)


def _fault_settings(cls: type) -> tuple[str, ...]:
    lines = []
    if cls.needs_trigger:
        points = "; ".join(f"{phase}: {' | '.join(points)}" for phase, points in cls.points.items())
        lines.append(f"trigger: {', '.join(TRIGGER_KEYS)} (phase -> points: {points})")
    for name, (allowed, default) in cls.params.items():
        lines.append(f"{name}: {_describe_allowed(allowed)}" + ("" if default is None else f" (default {default})"))
    return tuple(lines)


def entries(kind: str) -> list[Entry]:
    """Built-in plug-ins of ``kind`` ("strategy", "fault" or "workload"), in registry order."""
    found = []
    for name, target in registry.TABLES[kind].items():
        cls = registry.resolve(kind, name)
        settings: tuple[str, ...] = ()
        unavailable = None
        if kind == "strategy":
            settings, unavailable = _strategy_settings(cls), cls.missing()
        elif kind == "fault":
            settings = _fault_settings(cls)
        found.append(Entry(name=name, target=target, summary=first_sentence(cls), settings=settings,
                           unavailable=unavailable))
    return found


def render(kind: str) -> str:
    lines = []
    for entry in entries(kind):
        lines.append(f"{entry.name:<18} {entry.summary}")
        for setting in entry.settings:
            lines.append(f"{'':<20}{setting}")
        if entry.unavailable:
            lines.append(f"{'':<20}not available here: {entry.unavailable}")
    lines.append(f"\nYour own {kind}: name it as package.module:Class (a subclass of {registry.BASES[kind]}).")
    return "\n".join(lines)
