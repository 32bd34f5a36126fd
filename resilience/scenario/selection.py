"""Selecting cases by their values: ``-m "case(strategy='torch.rank0', fault_seconds=3)"`` under
pytest, ``-k`` with the same call in `resilience qualify`. A case id reads ``key=value,...`` and
pytest's ``-k`` language has no ``=``, so a case's values are offered as the keyword arguments of
one marker, ``case``, which ``-m`` matches (pytest 8.3 and later): each key path of the case id with
its dots written as underscores, plus the case's ``strategy`` (or ``script``), ``fault`` and ``tier``.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..core.case import Case
from ..core.script_case import ScriptCase

MARKER = "case"
Value = str | int | bool | None
_LITERALS: dict[str, Value] = {"True": True, "False": False, "None": None}


def selection_values(case: Case | ScriptCase) -> dict[str, Value]:
    """What ``case(...)`` matches for ``case``: the values its id names, and its system, fault and
    tier. Whole numbers are ints and True, False and None are themselves, as ``-m`` writes them;
    anything else is the id's text (``fault_fraction='0.5'``)."""
    system = ("script", Path(case.script.path).name) if isinstance(case, ScriptCase) \
        else ("strategy", case.strategy.name)
    values: dict[str, Value] = {system[0]: system[1], "fault": case.fault.kind, "tier": case.tier}
    for item in case.id.split(","):
        key, equals, text = item.partition("=")
        if equals:  # a case without a matrix has the id "case"
            values[key.replace(".", "_")] = _value(text)
    return values


def _value(text: str) -> Value:
    if text in _LITERALS:
        return _LITERALS[text]
    return int(text) if re.fullmatch(r"-?[0-9]+", text) else text


def keyword_hint(expression: str) -> str:
    """Why a ``-k`` expression with ``=`` in it selects nothing, and what does."""
    return (f"-k {expression!r}: pytest's -k language has no '=' (a case id's key=value cannot be "
            f"matched by it); select by a case's values with -m \"{MARKER}(strategy='torch.rank0', "
            "fault_seconds=3)\" (key paths with '_' for '.', whole numbers unquoted), or by words of "
            "the id without '=' (-k \"rank0 and seconds\")")
