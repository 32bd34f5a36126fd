"""Which files are scenarios, and the cases of the paths a command names."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..core.case import Case
from ..core.script_case import ScriptCase
from ..errors import ResilienceError
from .loader import is_script_file, load_any_file, load_file

SCENARIO_SUFFIXES = (".scenario.yaml", ".scenario.yml")


def is_scenario_file(path: Path | str) -> bool:
    return str(path).endswith(SCENARIO_SUFFIXES)


def scenario_files(paths: Iterable[str | Path]) -> list[Path]:
    """The scenario files under each path: a directory's, sorted and recursively; a file as named.
    A path that does not exist is an error naming it."""
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if is_scenario_file(p)))
        elif path.exists():
            files.append(path)
        else:
            raise ResilienceError(f"{text}: no such scenario file or directory")
    return files


def load_cases(paths: Iterable[str | Path], selected: Callable[[Case], bool] = lambda case: True
               ) -> tuple[list[Case], list[str]]:
    """The selected cases of every scenario file under ``paths``, and the load error of each file
    that could not be read (each names the file, the key and what is allowed). Scenarios on a
    user's script are left out: they run under pytest, ``resilience blackbox`` and ``qualify``
    (`load_all_cases`)."""
    cases, errors = load_all_cases(paths, selected, scripts=False)
    return [case for case in cases if isinstance(case, Case)], errors


def load_all_cases(paths: Iterable[str | Path], selected: Callable[[Case | ScriptCase], bool] = lambda case: True,
                   scripts: bool = True) -> tuple[list[Case | ScriptCase], list[str]]:
    """As `load_cases`, with the cases on users' scripts too (unless ``scripts`` is False)."""
    cases: list[Case | ScriptCase] = []
    errors = []
    for path in scenario_files(paths):
        on_script = is_script_file(path)
        if on_script and not scripts:
            continue
        try:
            loaded = load_any_file(path) if on_script else load_file(path).cases
            cases.extend(c for c in loaded if selected(c))
        except ResilienceError as exc:
            errors.append(str(exc))
    return cases, errors


def script_files(paths: Iterable[str | Path]) -> list[Path]:
    """The scenario files under ``paths`` whose cases run a user's script (an unreadable path: none)."""
    try:
        return [path for path in scenario_files(paths) if is_script_file(path)]
    except ResilienceError:
        return []
