"""The planted-bug catalogue: every deliberately broken strategy is caught by its case while the
correct twin passes the same case, and bugs written outside the repository against the documented
contract are caught too. Real ranks, real files, through the `resilience planted` command."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from resilience.planted.catalogue import BUGS, CATCHERS
from resilience.strategies.base import CheckpointStrategy

ROOT = Path(__file__).resolve().parent.parent


def planted(*args: str, tmp_path: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (pythonpath, ROOT) if p)
    return subprocess.run([sys.executable, "-m", "resilience", "planted", "--workdir", str(tmp_path / "work"),
                           *args], check=False, capture_output=True, text=True, env=env, timeout=1200,
                          cwd=tmp_path)


def test_the_catalogue_plants_at_least_twelve_distinct_documented_bugs():
    assert len(BUGS) >= 12 and len({b.name for b in BUGS}) == len(BUGS)
    catchers = {c.name for c in CATCHERS}
    for bug in BUGS:
        module, name = bug.strategy.split(":")
        strategy = getattr(importlib.import_module(module), name)
        assert issubclass(strategy, CheckpointStrategy) and strategy.__doc__, bug.name
        assert bug.catcher in catchers, bug.name
    assert {b.catcher for b in BUGS} == catchers  # no catcher without a bug it is known to catch


@pytest.mark.slow
@pytest.mark.minutes(3)
def test_every_planted_bug_is_caught_and_every_control_passes(tmp_path):
    report = tmp_path / "planted.json"
    done = planted("--json", str(report), tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"caught/planted = {len(BUGS)}/{len(BUGS)} (100%)" in done.stdout, done.stdout
    results = {r["bug"]: r for r in json.loads(report.read_text())}
    assert set(results) == {b.name for b in BUGS}
    for bug in BUGS:
        result = results[bug.name]
        catch = next(t for t in result["trials"] if t["judgement"] == "caught")
        assert catch["catcher"] == bug.catcher and catch["evidence"], result
        assert result["control"]["judgement"] == "accepted", result  # the case does not fail everything
    assert results["stale_lock_wait"]["trials"][0]["verdict"] == "HANG"
    assert results["version_stamp_ignored"]["trials"][0]["verdict"] == "RECOVERED"  # a correct reader refuses


OUTSIDE_BUGS = '''
"""Broken strategies written against the documented contract only, never seen by the catalogue."""
import torch
import torch.distributed as dist

from resilience.strategies.base import CheckpointStrategy


class PerRankFiles(CheckpointStrategy):
    """Every rank saves its whole state to step_<N>/rank<r>.pt and loads its own newest file."""

    def path(self, step, rank):
        return self.context.checkpoint_dir / f"step_{step:06d}" / f"rank{rank}.pt"

    def save(self, workload, step):
        self.path(step, 0).parent.mkdir(parents=True, exist_ok=True)
        torch.save(workload.state_dict(), self.path(step, self.context.rank))
        dist.barrier()

    def steps(self):
        root = self.context.checkpoint_dir
        return sorted(int(p.name[5:]) for p in root.glob("step_*")) if root.is_dir() else []

    def file_to_load(self, step):
        return self.path(step, self.context.rank)

    def load(self, workload):
        steps = self.steps()
        if steps:
            workload.load_state_dict(self.restore(steps[-1], workload))
        dist.barrier()

    def restore(self, step, workload):
        return torch.load(self.file_to_load(step), weights_only=True)


class ForgetsScheduler(PerRankFiles):
    """The learning-rate schedule restarts from its warm-up."""

    def restore(self, step, workload):
        return {**super().restore(step, workload), "scheduler": workload.state_dict()["scheduler"]}


class NeighboursFile(PerRankFiles):
    """Each rank loads the next rank's file (an off-by-one in a rank remap)."""

    def file_to_load(self, step):
        return self.path(step, (self.context.rank + 1) % self.context.world_size)


class FallsBackPerRank(PerRankFiles):
    """Each rank on its own falls back to its newest file that loads: ranks can resume from
    different steps."""

    def load(self, workload):
        for step in reversed(self.steps()):
            try:
                workload.load_state_dict(self.restore(step, workload))
                break
            except Exception:
                continue
        dist.barrier()
'''


@pytest.mark.slow
def test_bugs_planted_outside_the_repository_are_caught(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "user_bugs.py").write_text(textwrap.dedent(OUTSIDE_BUGS))
    names = ("ForgetsScheduler", "NeighboursFile", "FallsBackPerRank")
    report = tmp_path / "outside.json"
    done = planted(*(a for n in names for a in ("--strategy", f"user_bugs:{n}")), "--json", str(report),
                   tmp_path=tmp_path, pythonpath=outside)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "caught/planted = 3/3 (100%)" in done.stdout, done.stdout
    results = {r["bug"]: r for r in json.loads(report.read_text())}
    caught_by = {name: results[f"user_bugs:{name}"]["trials"][-1] for name in names}
    assert caught_by["ForgetsScheduler"]["catcher"] == "kill_in_training"
    assert caught_by["NeighboursFile"]["verdict"] == "SILENT"
    # the per-rank fallback passes the first catchers and is caught where a torn file splits the ranks
    assert caught_by["FallsBackPerRank"]["catcher"] == "torn_write", results["user_bugs:FallsBackPerRank"]
    assert "different steps" in caught_by["FallsBackPerRank"]["evidence"]
