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
from .matrix import id_items

MARKER = "case"
Value = str | int | bool | None
_LITERALS: dict[str, Value] = {"True": True, "False": False, "None": None}


def selection_values(case: Case | ScriptCase) -> dict[str, Value]:
    """What ``case(...)`` matches for ``case``: the values its id names, and its system, fault and
    tier. Whole numbers are ints and True, False and None are themselves, as ``-m`` writes them;
    anything else is the id's text (``fault_fraction='0.5'``)."""
    values: dict[str, Value] = {"script" if isinstance(case, ScriptCase) else "strategy": system_name(case),
                                "fault": case.fault.kind, "tier": case.tier}
    values.update((key.replace(".", "_"), _value(text)) for key, text in id_items(case.id))
    return values


def system_name(case: Case | ScriptCase) -> str:
    """What a case runs: its strategy's name, or its script's file name."""
    return Path(case.script.path).name if isinstance(case, ScriptCase) else case.strategy.name


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
