"""The validator's vocabulary: checks of one value each (a mapping's keys, an integer's range, a choice,
a plug-in name), and the problems of a file collected so that one error reports them all.

Every problem names the file, the key path, the bad value and what is allowed; a near miss among the
allowed names gets a "did you mean" (a mistyped strategy, fault kind, model or key).
"""
from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterable
from typing import Any

from ..core import registry
from ..core.confined import RELATIVE_GLOB, relative_glob_problem
from ..errors import PluginError, ScenarioError

NEAR_MISS = 0.7  # difflib ratio: 'torch.per_rnk' -> 'torch.per_rank' (0.96), not 'torch.magic' -> 'torch.rank0'
MAX_LISTED = 20  # problems one error lists; a matrix can repeat a mistake in every case


def did_you_mean(word: Any, candidates: Iterable[Any]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``candidates`` to a mistyped ``word``; '' if none is close."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [c for c in candidates if isinstance(c, str)], n=1, cutoff=NEAR_MISS)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Problems:
    """Every problem of one file, each once and in the order found, so a user fixes them in one go.
    The same mistake met again in another matrix case (the same key, value and problem) counts once."""

    def __init__(self, source: str):
        self.source = source
        self.found: list[ScenarioError] = []
        self._seen: set[str] = set()

    def add(self, error: ScenarioError, where: str = "") -> None:
        identity = str(error).replace(where, "", 1) if where else str(error)
        if identity not in self._seen:
            self._seen.add(identity)
            self.found.append(error)

    def raise_any(self) -> None:
        if self.found:
            raise self.error()

    def error(self) -> ScenarioError:
        """One problem: that error. Several: one error with the first's key, whose message has a line per
        problem, each as it reads alone (file: key path: problem; got value; allowed: ...)."""
        first, *rest = self.found
        if not rest:
            return first
        lines = [str(problem) for problem in rest[:MAX_LISTED - 1]]
        if len(rest) > len(lines):
            lines.append(f"{self.source}: and {len(rest) - len(lines)} more problems")
        alone = str(first).removeprefix(f"{first.path}: {first.key or '<document>'}: ")
        return ScenarioError(self.source, first.key, "\n".join([alone, *lines]), problems=tuple(self.found))


class Validator:
    """Checks one case document; every problem names the key path (and the matrix case, ``where``).

    A check that cannot go on raises; `section` notes that and lets the next, independent section run.
    A problem that leaves the value usable (an unknown key, ignored) is noted and checking goes on."""

    def __init__(self, source: str, where: str = "", problems: Problems | None = None):
        self.source, self.where = source, where
        self.problems = problems if problems is not None else Problems(source)
        self.failed: set[str] = set()
        self.found_any = False

    def error(self, key: str, problem: str, value: Any = None, allowed: Any = None) -> ScenarioError:
        return ScenarioError(self.source, key + self.where, problem, value, allowed)

    def note(self, error: ScenarioError) -> None:
        self.found_any = True
        self.problems.add(error, self.where)

    def rerooted(self, renames: dict[str, str]) -> "Validator":
        """This validator for a section checked at another place: a key path whose first part is
        in ``renames`` is named from there (``fault.step`` -> ``timeline.2.fault.step``)."""
        return RerootedValidator(self, renames)

    def section(self, name: str, check: Callable[..., Any], *args: Any) -> Any:
        """``check(*args)``, or None with its problem noted and ``name`` marked failed."""
        try:
            return check(*args)
        except ScenarioError as exc:
            self.note(exc)
            self.failed.add(name)
            return None

    def ok(self, *names: str) -> bool:
        """Whether none of these sections failed: the checks that build on them can run."""
        return not self.failed.intersection(names)

    # -- one value each ---------------------------------------------------------------------------
    def mapping(self, key: str, value: Any, allowed: tuple[str, ...]) -> dict:
        """The allowed keys of ``value``; each unknown key is noted, and left out."""
        if not isinstance(value, dict):
            raise self.error(key, "must be a mapping", value, allowed)
        for k in value:
            if k not in allowed:
                self.note(self.error(_join(key, str(k)), f"unknown key{did_you_mean(k, allowed)}", k, allowed))
        return {k: v for k, v in value.items() if k in allowed}

    def required(self, key: str, value: Any, allowed: Any = None) -> Any:
        if value is None:
            raise self.error(key, "missing required key", None, allowed)
        return value

    def string(self, key: str, value: Any, allowed: Any = None) -> str:
        value = self.required(key, value, allowed)
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, "must be a non-empty string", value)
        return value

    def integer(self, key: str, value: Any, low: int, high: int | None = None, allowed: str | None = None) -> int:
        value = self.required(key, value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, "must be an integer", value, allowed or _range(low, high))
        if value < low or (high is not None and value > high):
            raise self.error(key, "out of range", value, allowed or _range(low, high))
        return value

    def number(self, key: str, value: Any, low: float, high: float = math.inf) -> float:
        allowed = f"a number > {low}" + (f" and <= {high:g}" if high < math.inf else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be a finite number > {low}", value, allowed)
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not low < number < math.inf:  # also rejects nan; timedelta(seconds=inf) fails in the ranks
            raise self.error(key, f"must be a finite number > {low}", value, allowed)
        if number > high:
            raise self.error(key, "out of range", value, allowed)
        return number

    def plain(self, key: str, value: Any) -> Any:
        """Options travel to the rank processes as JSON: they must come back from it unchanged."""
        try:
            same = json.loads(json.dumps(value)) == value
        except (TypeError, ValueError, RecursionError):
            same = False
        if not same:
            raise self.error(key, "must hold only JSON values (strings, numbers, booleans, null, lists, "
                                  "mappings with string keys)", value)
        return value

    def relative_glob(self, key: str, value: Any) -> str:
        """A pattern of files under the checkpoint directory: never a way out of it."""
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, "must be a non-empty string", value, RELATIVE_GLOB)
        problem = relative_glob_problem(value)
        if problem:
            raise self.error(key, f"must stay inside the checkpoint directory; this pattern {problem}", value,
                             RELATIVE_GLOB)
        return value

    def choice(self, key: str, value: Any, allowed: tuple[str, ...]) -> str:
        value = self.required(key, value, allowed)
        if value not in allowed:
            raise self.error(key, f"not one of the allowed values{did_you_mean(value, allowed)}", value, allowed)
        return value

    def boolean(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, "must be true or false", value)
        return value

    def plugin(self, kind: str, key: str, name: Any) -> type:
        """The class a built-in name or `package.module:Class` names; the allowed names listed once."""
        table = registry.TABLES[kind]
        allowed = [*table, "package.module:Class"]
        name = self.string(key, name, allowed)
        if name not in table and not registry.is_import_path(name):
            raise self.error(key, f"unknown {kind} {name!r}{did_you_mean(name, table)}", name, allowed)
        try:
            return registry.resolve(kind, name)
        except PluginError as exc:
            raise self.error(key, str(exc), name, allowed) from None
        except Exception as exc:  # the module exists but raised while being imported
            raise self.error(key, f"importing {kind} {name!r} raised {type(exc).__name__}: {exc}",
                             name, allowed) from exc


class RerootedValidator(Validator):
    """`Validator.rerooted`: the same checks and problems, with renamed key paths."""

    def __init__(self, parent: Validator, renames: dict[str, str]):
        super().__init__(parent.source, parent.where, parent.problems)
        self.failed, self.parent, self.renames = parent.failed, parent, renames

    def error(self, key: str, problem: str, value: Any = None, allowed: Any = None) -> ScenarioError:
        first, dot, rest = key.partition(".")
        return super().error(self.renames[first] + dot + rest if first in self.renames else key,
                             problem, value, allowed)

    def note(self, error: ScenarioError) -> None:
        self.parent.note(error)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _range(low: int, high: int | None) -> str:
    return f"{low}..{high}" if high is not None else f">= {low}"
