"""How `resilience qualify` executes a case: the seam between choosing cases and running them.

A launcher is a callable ``run_case(case) -> CaseResult``. ``local`` is this machine's harness
(ranks forked or spawned by it). ``torchrun`` runs the case under torchrun's elastic agent; it
comes from the module named in ``TORCHRUN_ENTRY``, which must offer
``run_case(case, *, work_root, keep) -> CaseResult``; where that module is absent the launcher
refuses with `LauncherUnavailable` instead of pretending.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from .backend import BACKENDS, DEFAULT_BACKEND
from .errors import ResilienceError
from .harness import CaseResult, Harness
from .reference_cache import ReferenceCache
from .scenario import Case

CaseRunner = Callable[[Case], CaseResult]
TORCHRUN_ENTRY = "resilience.torchrun:run_case"
LAUNCHERS = ("local", "torchrun")


class LauncherUnavailable(ResilienceError):
    """The chosen execution mode is not part of this installation."""


def local(*, work_root: Path | None, keep: bool, cache: ReferenceCache | None,
          backend: str = DEFAULT_BACKEND) -> CaseRunner:
    return Harness(backend=BACKENDS[backend](), work_root=work_root, keep=keep, cache=cache).run


def torchrun(*, work_root: Path | None, keep: bool) -> CaseRunner:
    module_name, _, function = TORCHRUN_ENTRY.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:  # the module exists but something it imports does not
            raise
        raise LauncherUnavailable(f"--launcher torchrun: not available in this installation "
                                  f"({module_name} is missing); use --launcher local") from None
    run_case = getattr(module, function, None)
    if run_case is None:
        raise LauncherUnavailable(f"--launcher torchrun: {module_name} has no {function}(case, *, work_root, keep)")
    return lambda case: run_case(case, work_root=work_root, keep=keep)


def make(name: str, *, work_root: Path | None, keep: bool, cache: ReferenceCache | None,
         backend: str = DEFAULT_BACKEND) -> CaseRunner:
    if name == "local":
        return local(work_root=work_root, keep=keep, cache=cache, backend=backend)
    if name == "torchrun":
        return torchrun(work_root=work_root, keep=keep)
    raise LauncherUnavailable(f"--launcher: unknown launcher {name!r}; allowed: {', '.join(LAUNCHERS)}")
