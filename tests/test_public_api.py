"""The paths users and plug-in authors import stay stable, `import resilience` stays cheap, and the
reference cache notices an edit to any code a rank runs."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, *, path: Path = ROOT, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=path, capture_output=True, text=True, timeout=timeout,
                          env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin", "HOME": str(path),
                               "RESILIENCE_CACHE": str(path / "unused-cache")})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_resilience_imports_no_torch_and_every_public_name_resolves():
    shown = json.loads(_python(
        "import json, sys, resilience; before = 'torch' in sys.modules; "
        "names = {n: getattr(resilience, n).__module__ for n in resilience.__all__}; "
        "print(json.dumps({'torch_at_import': before, 'names': names}))"))
    assert shown["torch_at_import"] is False
    assert {"CheckpointStrategy", "Fault", "Workload", "Harness", "load_file", "VerdictKind"} <= shown["names"].keys()
    assert all(module.startswith("resilience.") for module in shown["names"].values())


def test_the_stable_public_paths_still_import():
    import resilience
    from resilience.faults.base import CaseEnvironment, Fault, RankEnvironment
    from resilience.strategies.base import CheckpointStrategy, StrategyContext
    from resilience.workload import MLPWorkload, Workload

    assert resilience.CheckpointStrategy is CheckpointStrategy and resilience.Fault is Fault
    assert resilience.Workload is Workload and issubclass(MLPWorkload, Workload)
    assert StrategyContext and CaseEnvironment and RankEnvironment
    with pytest.raises(AttributeError, match="public names"):
        resilience.NoSuchThing  # noqa: B018 -- the lookup itself is the test


def test_the_pytest_entry_point_and_the_command_resolve():
    distribution = metadata.distribution("resilience")
    plugin = next(e for e in distribution.entry_points if e.group == "pytest11")
    command = next(e for e in distribution.entry_points if e.group == "console_scripts" and e.name == "resilience")
    assert plugin.load().pytest_collect_file and callable(command.load())


KEY = ("from resilience.run.reference_cache import reference_key; "
       "from resilience.scenario.loader import load_file; import resilience; "
       "assert resilience.__file__.startswith({root!r}), resilience.__file__; "
       "print(reference_key(load_file({scenario!r}).cases[0], False))")


def test_the_reference_key_changes_with_any_code_a_rank_runs_and_only_with_that(tmp_path):
    """A copy of the package: edit a helper that moved out of the worker (the event log), one of
    the disk layer, and a command; only the rank-side edits may give a new key."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "resilience", copy / "resilience", ignore=shutil.ignore_patterns("__pycache__"))
    scenario = str(ROOT / "scenarios" / "no_fault.scenario.yaml")

    def key() -> str:
        return _python(KEY.format(root=str(copy), scenario=scenario), path=copy).strip()

    def edit(relative: str) -> None:
        path = copy / "resilience" / relative
        path.write_text(path.read_text() + "\n# edited\n")

    original = key()
    edit("commands/cli.py")  # the controller only: the reference it would compute is the same
    assert key() == original
    edit("core/events.py")
    after_events = key()
    assert after_events != original
    edit("disk/interception.py")
    assert key() not in (original, after_events)
