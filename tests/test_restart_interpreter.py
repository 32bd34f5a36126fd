"""The restart under another interpreter (restart.python) or with packages layered over this
environment (restart.packages): how an upgrade of torch or DeepSpeed is qualified."""
from __future__ import annotations

import subprocess
import sys
import sysconfig

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import HarnessError, ScenarioError
from resilience.launch.interpreters import layered_packages

from .harness_helpers import case_from, run_case


def joined_versions(result, phase_name):
    phase = next(p for p in result.phases if p.name == phase_name)
    return [e["versions"] for e in phase.events("joined")]


def test_the_restart_runs_under_the_interpreter_the_scenario_names(tmp_path):
    # a second environment: its own interpreter, this one's packages through a .pth file
    venv = tmp_path / "other-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    (tmp_path / "base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (tmp_path / "base.pth").rename(f"{purelib}/base-environment.pth")

    result = run_case(tmp_path / "work", restart={"python": str(python)},
                      fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert {v["executable"] for v in joined_versions(result, "restart")} == {str(python)}
    assert {v["executable"] for v in joined_versions(result, "first_run")} != {str(python)}
    assert "continuation" not in {p.name for p in result.phases}  # it went on bit for bit as the reference

    # a restore that loses the optimizer: the oracle is a continuation under the restart's interpreter
    result = run_case(tmp_path / "work", restart={"python": str(python)},
                      strategy="tests.strategies_under_test:ForgetsOptimizer",
                      fault={"kind": "kill", "rank": 1, "step": 6, "phase": "train"})
    assert result.verdict.kind is VerdictKind.SILENT, result.verdict.findings
    assert {v["executable"] for v in joined_versions(result, "continuation")} == {str(python)}
    assert any("optimizer" in finding for finding in result.verdict.findings), result.verdict.findings


def test_a_missing_restart_interpreter_is_a_clear_error(tmp_path):
    with pytest.raises(HarnessError) as info:
        run_case(tmp_path, restart={"python": "no/such/python"})
    assert "restart.python: 'no/such/python' is not an executable file" in str(info.value)


@pytest.mark.parametrize("restart, key, shown", [
    ({"python": ""}, "restart.python", "got ''"),
    ({"packages": "deepspeed"}, "restart.packages", "got 'deepspeed'"),
    ({"packages": ["deepspeed; rm -rf /"]}, "restart.packages", "rm -rf"),
    ({"packages": ["--index-url=http://x"]}, "restart.packages", "--index-url"),
    ({"python": "/usr/bin/python3", "packages": ["deepspeed==0.17.6"]}, "restart.packages", "not both"),
])
def test_bad_restart_environments_are_refused_by_the_loader(restart, key, shown):
    with pytest.raises(ScenarioError) as info:
        case_from(restart=restart)
    assert key in str(info.value) and shown in str(info.value)


def test_layered_packages_are_installed_once_and_shadow_the_environment(tmp_path):
    target = layered_packages(("six==1.16.0",), root=tmp_path)
    assert (target / "six.py").is_file()
    assert layered_packages(("six==1.16.0",), root=tmp_path) == target  # cached, not reinstalled
    shown = subprocess.run([sys.executable, "-c", "import six; print(six.__version__, six.__file__)"],
                           env={"PYTHONPATH": str(target)}, check=True, capture_output=True, text=True,
                           timeout=60).stdout
    assert shown.startswith("1.16.0 " + str(target))
