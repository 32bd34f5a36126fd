"""Each stack package declares its libraries (resilience/strategies/stack.py): what the fork server
preloads, which distributions a report names. A module an installed release lacks is skipped."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from resilience.core.registry import STACKS, STRATEGIES
from resilience.strategies.stack import Stack, distributions, install_environment, stacks


def test_every_stack_package_declares_its_stack_and_every_strategy_lives_in_one():
    declared = stacks()
    assert [stack.name for stack in declared] == [package.rpartition(".")[2] for package in STACKS]
    assert {"torch", "deepspeed", "megatron-core"} <= set(distributions())
    assert install_environment()["DS_BUILD_OPS"] == "0"
    for name, target in STRATEGIES.items():
        module = target.partition(":")[0]
        assert module.startswith(STACKS) or module.count(".") == 2, (name, module)  # a stack's or a generic one


def test_a_module_the_installed_release_lacks_is_skipped_not_fatal(monkeypatch):
    monkeypatch.delenv("RESILIENCE_TEST_CPU_FLAG", raising=False)
    stack = Stack(name="probe", preload=("json", "json.no_such_module_in_this_release", "email.utils"),
                  cpu_environment={"RESILIENCE_TEST_CPU_FLAG": "cpu"})
    assert stack.run_preload(cuda_available=False) == ("json.no_such_module_in_this_release",)
    assert os.environ["RESILIENCE_TEST_CPU_FLAG"] == "cpu"
    absent = Stack(name="absent", preload=("no_such_library.sub",), requires="no_such_library.core")
    assert not absent.installed() and absent.run_preload(cuda_available=False) == ()


def test_every_installed_stack_preloads_every_module_it_names():
    """In a fresh interpreter, as the fork server does: the installed releases have every module."""
    code = ("import json; from resilience.strategies.stack import stacks\n"
            "print(json.dumps({s.name: [s.installed(), s.run_preload(False)] for s in stacks()}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"] == [True, []]
    assert all(skipped == [] for installed, skipped in report.values() if installed), report
