"""Where ranks run when they should not run in the harness's own environment: another Python
interpreter (``python``), or this one with other releases of some packages layered over it
(``packages``), for a whole case (``software``) or for its restart alone (``restart.python``,
``restart.packages``), so that a user qualifies an upgrade or a downgrade: save with one DeepSpeed
or torch, restore with another; or runs a case on a release the environment does not hold.

Layered packages are installed once with ``pip install --no-deps --target`` into a cached
directory that goes first on the restart ranks' ``PYTHONPATH``, so they shadow the installed ones
and everything else comes from this environment.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.case import Software
from ..core.directory_cache import DirectoryCache
from ..errors import HarnessError, Unavailable
from ..strategies.stack import install_environment

INSTALL_TIMEOUT_S = 900
LIST_TIMEOUT_S = 120


@dataclass(frozen=True)
class Interpreter:
    """How to start a rank process: the executable and what goes first on its import path."""

    python: str
    path_prefix: tuple[str, ...] = ()
    inherit_path: bool = True  # False for a foreign interpreter: its own site-packages, not ours


def default_packages_dir() -> Path:
    configured = os.environ.get("RESILIENCE_PACKAGES")
    return Path(configured) if configured else Path.home() / ".cache" / "resilience" / "packages"


def layered_packages(requirements: tuple[str, ...], root: Path | None = None) -> Path:
    """A directory holding ``requirements`` (without their dependencies), installed once per
    interpreter and set of requirements; safe when several harnesses ask at the same time."""
    identity = json.dumps({"python": sys.version, "prefix": sys.prefix, "requirements": sorted(requirements)})

    def install(target: Path) -> None:
        env = dict(os.environ, **install_environment(), PIP_DISABLE_PIP_VERSION_CHECK="1")
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                   *requirements]
        try:
            done = subprocess.run(command, check=False, capture_output=True, text=True, env=env,
                                  timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"installing {' '.join(requirements)} took over {INSTALL_TIMEOUT_S} s") from None
        if done.returncode:
            raise Unavailable(f"cannot install {' '.join(requirements)}: "
                              f"{(done.stdout + done.stderr).strip()[-1500:]}")

    cache = DirectoryCache(root or default_packages_dir())  # one complete directory per key, built once
    return cache.entry(hashlib.sha256(identity.encode()).hexdigest()[:24], install)


def released_versions(name: str) -> tuple[str, ...]:
    """The releases of distribution ``name`` on the package index pip reaches (its configuration:
    index URL, find-links), oldest first; pre-releases and yanked ones left out, as pip leaves them."""
    from packaging.version import InvalidVersion, Version

    command = [sys.executable, "-m", "pip", "index", "versions", name]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=LIST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"listing the releases of {name} took over {LIST_TIMEOUT_S} s") from None
    listed = [line.split(":", 1)[1] for line in done.stdout.splitlines() if line.startswith("Available versions:")]
    if done.returncode or not listed:
        raise Unavailable(f"cannot list the releases of {name}: {(done.stdout + done.stderr).strip()[-800:]}")
    versions = []
    for text in listed[0].split(","):
        try:
            versions.append(Version(text.strip()))
        except InvalidVersion:
            continue  # a legacy version string pip itself would not pick
    return tuple(str(v) for v in sorted(versions))


def for_software(software: Software, scenario_source: str, key: str = "software") -> Interpreter | None:
    """The interpreter ranks run under for ``software`` (a case's, or its restart's: ``key`` says
    which, for errors), or None for this environment as it is (the harness's own, forked, ranks)."""
    if software.packages:
        return Interpreter(python=sys.executable, path_prefix=(str(layered_packages(software.packages)),))
    if software.python is None:
        return None
    path = Path(software.python).expanduser()
    if not path.is_absolute():  # relative to the scenario file, like a path in a conftest
        path = Path(scenario_source).resolve().parent / path
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise HarnessError(f"{key}.python: {software.python!r} is not an executable file (looked at {path})")
    return Interpreter(python=str(path), inherit_path=False)
