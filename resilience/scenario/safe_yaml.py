"""Scenario text -> plain data: safe YAML, duplicate keys refused, size bounded before anything expands.

A scenario is a few KiB (the largest shipped one is about 5 KiB, 350 nodes deep 7). Beyond the limits
here a file is refused before anything expands it: aliases make a small file a huge document (billion
laughs). Every problem is a `ScenarioError` naming the source.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import ScenarioError

MAX_FILE_BYTES = 128 << 10
MAX_NODES = 20_000  # YAML nodes, every alias counted as the whole value it repeats
MAX_DEPTH = 40


BOOL_TAG, STR_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:str"


class StrictLoader(yaml.SafeLoader):
    """Safe YAML that rejects duplicate keys instead of keeping the last one silently."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as exc:  # e.g. `2001-13-45` or `!!int x`: PyYAML raises ValueError & co. without a mark
            value = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            raise yaml.constructor.ConstructorError(
                None, None, f"invalid value {str(value)[:40]!r}: {type(exc).__name__}: {str(exc)[:200]}",
                node.start_mark) from None


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor` merge keys: SafeLoader.construct_mapping flattens them
        if (key_node.tag == BOOL_TAG and key_node.style is None
                and key_node.value.lower() not in ("true", "false")):
            key_node.tag = STR_TAG  # YAML 1.1 reads a plain `on:` (`off`, `yes`, `no`) key as a bool
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a scalar, not a {type(key).__name__}",
                key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_scenario_text(path: Path) -> str:
    """The file's text, read no further than the limit (``/dev/zero`` ends there too)."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
        check_length(len(data), str(path))
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(path), "", f"cannot read the file: {exc}") from None


def check_length(length: int, source: str) -> None:
    if length > MAX_FILE_BYTES:
        raise ScenarioError(source, "", f"larger than {MAX_FILE_BYTES >> 10} KiB; a scenario is a few KiB")


def parse_yaml(text: str, source: str) -> Any:
    """The document ``text`` holds; whatever PyYAML makes of a hostile text becomes a `ScenarioError`."""
    check_length(len(text), source)
    try:
        return _safe_load(text, source)
    except ScenarioError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(source, "", f"YAML syntax error{where}: {problem}") from None
    except RecursionError:
        raise ScenarioError(source, "", "YAML nesting too deep") from None
    except Exception as exc:  # PyYAML's constructors raise ValueError & co. for e.g. `2001-13-45`, `!!int x`
        raise ScenarioError(source, "", f"invalid YAML value: {type(exc).__name__}: {exc}") from None


def _safe_load(text: str, source: str) -> Any:
    """Safe YAML (no tags that build objects), refused when it expands past MAX_NODES or MAX_DEPTH."""
    loader = StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        problem = _size_problem(root)
        if problem:
            raise ScenarioError(source, "", problem)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _size_problem(root: yaml.Node) -> str | None:
    """Walks the node graph as the document will be (aliases expanded), stopping at the limits."""
    pending, count = [(root, 1)], 0
    while pending:
        node, depth = pending.pop()
        count += 1
        if count > MAX_NODES:
            return f"the document expands to more than {MAX_NODES} values (aliases count once per use)"
        if depth > MAX_DEPTH:
            return f"the document nests deeper than {MAX_DEPTH} levels"
        if isinstance(node, yaml.SequenceNode):
            pending.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            pending.extend((child, depth + 1) for pair in node.value for child in pair)
    return None
