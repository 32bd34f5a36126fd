"""Repeatability: the same cases rerun give the same verdicts, under either way of starting ranks,
and a case whose verdict changes between rounds is reported. Real ranks through `resilience repeat`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from resilience.commands.repeat import Observation, Repetition, summary

ROOT = Path(__file__).resolve().parent.parent


def repeat(*args: str, tmp_path: Path, extra_path: Path | None = None, env: dict | None = None):
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(str(p) for p in (extra_path, ROOT) if p)
    return subprocess.run([sys.executable, "-m", "resilience", "repeat", "--workdir", str(tmp_path / "work"), *args],
                          check=False, capture_output=True, text=True, env=environment, timeout=1200, cwd=ROOT)


def test_a_changed_observation_is_reported_with_every_round():
    same = Observation("RECOVERED", 8, "passed")
    backends = ("fork", "spawn", "fork")
    flaky = Repetition("a.scenario.yaml[x]", (same, Observation("SILENT", 8, "failed"), same), backends)
    text = summary([Repetition("a.scenario.yaml[y]", (same, same, same), backends), flaky], 3)
    assert not flaky.stable
    assert ("CHANGED a.scenario.yaml[x]: RECOVERED step 8 passed (fork) | SILENT step 8 failed (spawn) | "
            "RECOVERED step 8 passed (fork)") in text
    assert text.endswith("1/2 cases gave the same verdict in all 3 rounds; 1 changed")


@pytest.mark.slow
@pytest.mark.minutes(7)
def test_the_smoke_tier_gives_identical_verdicts_in_three_rounds_under_both_backends(tmp_path):
    """Round 1 with a cold reference cache and forked ranks, round 2 with spawned ranks (each a fresh
    interpreter importing torch and the library under test), round 3 forked again."""
    report = tmp_path / "repeat.json"
    done = repeat("scenarios/", "--tier", "smoke", "--times", "3", "--backend", "fork", "--also-backend", "spawn",
                  "--json", str(report), tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    repetitions = json.loads(report.read_text())
    assert len(repetitions) >= 10 and all(r["stable"] for r in repetitions)
    assert all(len(r["observations"]) == 3 and r["backends"] == ["fork", "spawn", "fork"] for r in repetitions)
    assert {o["status"] for r in repetitions for o in r["observations"]} <= {"passed", "xfailed"}


FLAKY = '''
"""A strategy that forgets the optimizer on every other restore (a race, seen from outside)."""
import os
from pathlib import Path

from resilience.planted.state_bugs import ForgetsOptimizer
from resilience.strategies.torch.native import PerRankSave


class SometimesForgets(PerRankSave):
    def restore_from(self, path, workload):
        counter = Path(os.environ["FLAKY_COUNTER"]) / f"rank{self.context.rank}"
        restores = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(restores + 1))
        restore = ForgetsOptimizer.restore_from if restores % 2 else PerRankSave.restore_from
        restore(self, path, workload)
'''


@pytest.mark.slow
def test_a_flaky_strategy_is_reported_as_changed(tmp_path):
    module = tmp_path / "module"
    module.mkdir()
    (module / "flaky_strategy.py").write_text(textwrap.dedent(FLAKY))
    counter = tmp_path / "counter"
    counter.mkdir()
    scenario = tmp_path / "flaky.scenario.yaml"
    scenario.write_text(textwrap.dedent("""\
        name: flaky restore
        description: forgets the optimizer on every other restore
        strategy: flaky_strategy:SometimesForgets
        workload: {model: mlp, world_size: 2, steps: 8, checkpoint_every: 4, seed: 0}
        fault: {kind: kill, rank: 1, step: 6, phase: train}
        expect: recovers
        """))
    done = repeat(str(scenario), "--times", "2", tmp_path=tmp_path, extra_path=module,
                  env={"FLAKY_COUNTER": str(counter)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "CHANGED" in done.stdout, done.stdout
    assert "RECOVERED step 4 passed (fork) | SILENT step 4 failed (fork)" in done.stdout, done.stdout
    assert "0/1 cases gave the same verdict in all 2 rounds; 1 changed" in done.stdout
