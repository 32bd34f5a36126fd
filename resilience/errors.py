"""Errors the framework raises on purpose, each saying what to fix."""
from __future__ import annotations

from typing import Any, Iterable


class ResilienceError(Exception):
    """Base of every error the framework raises on purpose."""


class ScenarioError(ResilienceError):
    """A scenario file is malformed: names the file, the key path, the bad value and what is allowed.
    A file with several problems raises one error whose ``problems`` holds each (``key`` is the
    first's); with one, ``problems`` is just this error."""

    def __init__(self, path: str, key: str, problem: str, value: Any = None,
                 allowed: Iterable[Any] | str | None = None, problems: tuple[ScenarioError, ...] = ()):
        self.path, self.key, self.problem, self.value = path, key, problem, value
        self.problems = problems or (self,)
        self.allowed = allowed if isinstance(allowed, (str, type(None))) else ", ".join(map(str, allowed))
        parts = [f"{path}: {key or '<document>'}: {problem}"]
        if value is not None:
            parts.append(f"got {value!r}")
        if self.allowed:
            parts.append(f"allowed: {self.allowed}")
        super().__init__("; ".join(parts))


class PluginError(ResilienceError):
    """A strategy, fault or workload name that cannot be resolved to a plug-in class."""


class PathEscape(ResilienceError):
    """A path a scenario named resolves outside the directory it must stay in (a symlink pointing
    out, say): the framework refuses to touch it."""


class HarnessError(ResilienceError):
    """The harness itself could not run a case (not a verdict about the system under test)."""


class LauncherFailed(HarnessError):
    """torchrun's agent or its rendezvous failed around a user's script: not a verdict on the
    script; the message holds the command that reproduces it and the agent's output."""


class NotReproducible(HarnessError):
    """Two uninterrupted runs of a user's script differ: it cannot be judged bitwise (its case may
    ask for ``oracle: envelope``)."""


class Unavailable(ResilienceError):
    """This machine lacks what a case needs (root for a mount, an optional library): the case is
    skipped with this reason, which ``CI=true`` turns into a failure."""


class StrategyUnavailable(Unavailable):
    """The strategy's library is not installed."""


class FaultUnavailable(Unavailable):
    """This machine cannot inject the fault (for example: mounting needs root). The case is skipped."""


class NetworkError(HarnessError):
    """A network command failed while the case was running: the harness could not inject the fault."""


class SlurmError(HarnessError):
    """The one-machine SLURM cluster could not start, or a command to it failed (names the command and its words)."""


class TorchrunIncompatible(ResilienceError):
    """The case cannot be expressed as one torchrun job (it names why)."""


class LauncherUnavailable(ResilienceError):
    """The chosen execution mode is not part of this installation."""


class NotExpressible(Unavailable):
    """The launcher cannot run this case as the scenario describes it (reported as skipped)."""


class CaseFailed(ResilienceError):
    """The verdict is not the one the scenario expects; the message is the rendered report."""


class InjectedCrash(RuntimeError):
    """Raised by the crash fault (``how: thread_exception``) inside the thread that writes a
    checkpoint file: what a writer thread's own bug or a library error there looks like."""


class InjectedCollectiveFailure(RuntimeError):
    """Raised by the collective_failure fault (``how: raise``) in place of one rank's next
    ``all_reduce`` or ``barrier``: what an all-reduce failure a fault-tolerant trainer injects looks like."""
