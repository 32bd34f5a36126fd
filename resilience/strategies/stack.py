"""What each stack package declares about its libraries, so that the layers above (the fork
server's preload, a rank's version record, a qualification's environment report, the layered
package installer) never name a library themselves.

Every stack package (``resilience.strategies.<stack>``) defines ``STACK`` in its ``__init__.py``;
`resilience.core.registry.STACKS` lists the packages. Reading a declaration imports only the
package's ``__init__``: no library of the stack.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.registry import STACKS


@dataclass(frozen=True)
class Stack:
    """One stack's libraries, as the layers above ask about them.

    The fork server calls ``preload()`` once, before it forks any rank (and before it counts its
    threads: nothing listed may start one); a rank records ``distributions`` in its ``joined``
    event; a qualification report names their versions; the layered-package installer sets
    ``install_environment`` when it pip-installs other releases for a restart."""

    name: str
    #: the installed distributions (pip names) whose versions a report and a rank's record name
    distributions: tuple[str, ...] = ()
    #: modules the fork server imports once, in order, so that forked ranks need not (a module the
    #: installed release lacks is skipped: older and newer releases move modules around)
    preload: tuple[str, ...] = ()
    #: the preload runs only where this module is importable (None: always)
    requires: str | None = None
    #: set (unless already set) before the preload where CUDA is absent
    cpu_environment: Mapping[str, str] = field(default_factory=dict)
    #: set while pip installs this stack's packages (a build switch, say)
    install_environment: Mapping[str, str] = field(default_factory=dict)

    def installed(self) -> bool:
        if self.requires is None:
            return True
        try:
            return importlib.util.find_spec(self.requires) is not None
        except ModuleNotFoundError:  # a parent package is missing
            return False

    def run_preload(self, cuda_available: bool) -> tuple[str, ...]:
        """Import ``preload``; returns the modules skipped because the installed release lacks them."""
        if not self.installed():
            return ()
        if not cuda_available:
            for name, value in self.cpu_environment.items():
                os.environ.setdefault(name, value)
        skipped = []
        with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed", once per rank
            warnings.simplefilter("ignore", UserWarning)
            for module in self.preload:
                try:
                    importlib.import_module(module)
                except ModuleNotFoundError:
                    skipped.append(module)
        return tuple(skipped)


def stacks() -> tuple[Stack, ...]:
    """Every stack's declaration, in `resilience.core.registry.STACKS` order."""
    return tuple(importlib.import_module(package).STACK for package in STACKS)


def distributions() -> tuple[str, ...]:
    """Every distribution a stack names, once, in order."""
    return tuple(dict.fromkeys(name for stack in stacks() for name in stack.distributions))


def install_environment() -> dict[str, str]:
    """What every stack asks to be set while pip installs packages."""
    merged: dict[str, str] = {}
    for stack in stacks():
        merged.update(stack.install_environment)
    return merged
