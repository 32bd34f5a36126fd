"""The one to-JSON/from-JSON pair for the frozen records that cross between processes (a case as
its ranks receive it): `to_json` writes a dataclass's fields, `from_json` rebuilds the record from
its class's field types, so the receiving process gets the records the sender validated, without
validating anything again. Free-form values (``Any``, a ``Mapping``'s values) keep their tuples:
a tuple is written as ``{"__tuple__": [...]}``."""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Union

TUPLE = "__tuple__"


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data: a dataclass as the dict of its fields, an enum as its value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return {TUPLE: [to_json(item) for item in value]}
    if isinstance(value, list):
        return [to_json(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): to_json(item) for key, item in value.items()}
    return value


def from_json(kind: Any, data: Any) -> Any:
    """The value of type ``kind`` that `to_json` wrote as ``data``."""
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in arguments:
            return None
        return from_json(next(a for a in arguments if a is not type(None)), data)
    if dataclasses.is_dataclass(kind):
        hints = _field_types(kind)
        return kind(**{name: from_json(hints[name], value) for name, value in data.items()})
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(data)
    if origin is tuple:
        items = data[TUPLE] if isinstance(data, dict) else data
        element = arguments[0] if arguments else Any
        return tuple(from_json(element, item) for item in items)
    if origin in (dict, Mapping, typing.Mapping) or kind in (dict, Mapping):
        element = arguments[1] if len(arguments) == 2 else Any
        return {key: from_json(element, item) for key, item in data.items()}
    return _free(data)


def _free(data: Any) -> Any:
    """A free-form value: JSON as it is, with its tuples back."""
    if isinstance(data, dict):
        if set(data) == {TUPLE}:
            return tuple(_free(item) for item in data[TUPLE])
        return {key: _free(item) for key, item in data.items()}
    if isinstance(data, list):
        return [_free(item) for item in data]
    return data


@cache
def _field_types(kind: type) -> dict[str, Any]:
    """A dataclass's fields and their types (the annotations resolved; ClassVars are no fields)."""
    hints = typing.get_type_hints(kind)
    return {f.name: hints[f.name] for f in dataclasses.fields(kind)}
