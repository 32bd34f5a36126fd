"""How `resilience qualify` executes a case: the seam between choosing cases and running them.

A launcher is a callable ``run_case(case) -> CaseResult``. ``local`` is this machine's harness
(ranks forked or spawned by it). ``torchrun`` runs the case under torchrun's elastic agent
(`resilience.run.torchrun`), whose restart is the elastic restart.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..core.case import Case
from ..core.records import CaseResult
from ..errors import LauncherUnavailable, NotExpressible
from ..launch.backend import BACKENDS, DEFAULT_BACKEND
from .harness import Harness
from .reference_cache import ReferenceCache

CaseRunner = Callable[[Case], CaseResult]
LAUNCHERS = ("local", "torchrun")


def local(*, work_root: Path | None, keep: bool, cache: ReferenceCache | None,
          backend: str = DEFAULT_BACKEND) -> CaseRunner:
    return Harness(backend=BACKENDS[backend](), work_root=work_root, keep=keep, cache=cache).run


def torchrun(*, work_root: Path | None, keep: bool) -> CaseRunner:
    """One torchrun job per case on this node (`resilience.run.torchrun`); a case torchrun cannot
    express (a restart at another world size, a fault acting from outside the ranks) is skipped
    with the reason."""
    from .torchrun import TorchrunIncompatible, run_case_under_torchrun

    def run_case(case: Case) -> CaseResult:
        try:
            return run_case_under_torchrun(case, work_root=work_root, keep=keep)
        except TorchrunIncompatible as exc:
            raise NotExpressible(f"not run under torchrun: {exc}") from None

    return run_case


def make(name: str, *, work_root: Path | None, keep: bool, cache: ReferenceCache | None,
         backend: str = DEFAULT_BACKEND) -> CaseRunner:
    if name == "local":
        return local(work_root=work_root, keep=keep, cache=cache, backend=backend)
    if name == "torchrun":
        return torchrun(work_root=work_root, keep=keep)
    raise LauncherUnavailable(f"--launcher: unknown launcher {name!r}; allowed: {', '.join(LAUNCHERS)}")
