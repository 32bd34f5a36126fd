"""Software for a whole case (``software:``: every phase, the reference's too, under layered
releases or another interpreter) and `resilience bisect`, which runs a case across the releases of
one library and finds where its verdict changes."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resilience.commands.bisect import Observation, case_under, one_line, release_range, search
from resilience.core.case import Software, VerdictKind
from resilience.errors import ScenarioError
from resilience.launch.torchrun_command import incompatibility
from resilience.run.reference_cache import reference_key

from .harness_helpers import REFERENCE_CACHE_ENV, case_from, run_case

ROOT = Path(__file__).resolve().parents[1]
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is not installed (pip install -e '.[deepspeed]')")
KILL = {"kind": "kill", "rank": 1, "step": 6, "phase": "train"}


def joined(result, phase_name: str) -> list[dict]:
    phase = result.phase(phase_name)
    return [event["versions"] for event in phase.events("joined")]


@needs_deepspeed
@pytest.mark.slow
def test_every_phase_runs_under_the_case_software(tmp_path):
    result = run_case(tmp_path, strategy="deepspeed.zero2", software={"packages": ["deepspeed==0.17.6"]}, fault=KILL)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    for phase in ("reference", "first_run", "restart"):
        assert {versions["deepspeed"] for versions in joined(result, phase)} == {"0.17.6"}, phase
    assert result.phase("continuation") is None  # one software throughout: the reference is the oracle


def test_the_restart_runs_the_case_software_unless_it_names_its_own():
    case = case_from(software={"packages": ["deepspeed==0.17.6"]})
    assert case.restart_software == case.software == Software(packages=("deepspeed==0.17.6",))
    assert not case.software_changes and not case.continuation_is_oracle
    upgraded = case_from(software={"packages": ["deepspeed==0.17.6"]}, restart={"packages": ["deepspeed==0.18.0"]})
    assert upgraded.restart_software == Software(packages=("deepspeed==0.18.0",))
    assert upgraded.software_changes and upgraded.continuation_is_oracle
    assert not case_from().software and case_from().restart_software == Software()


def test_the_reference_cache_keys_on_the_case_software():
    plain = reference_key(case_from(), with_snapshots=False)
    layered = reference_key(case_from(software={"packages": ["six==1.16.0"]}), with_snapshots=False)
    other = reference_key(case_from(software={"packages": ["six==1.17.0"]}), with_snapshots=False)
    assert len({plain, layered, other}) == 3


@pytest.mark.parametrize("software, key, shown", [
    ("deepspeed", "software", "got 'deepspeed'"),
    ({}, "software", "names no software"),
    ({"packages": "deepspeed"}, "software.packages", "got 'deepspeed'"),
    ({"packages": ["deepspeed; rm -rf /"]}, "software.packages", "rm -rf"),
    ({"python": ""}, "software.python", "got ''"),
    ({"python": "/usr/bin/python3", "packages": ["six"]}, "software.packages", "not both"),
    ({"pip": ["six"]}, "software.pip", "python, packages"),
])
def test_bad_case_software_is_refused_by_the_loader(software, key, shown):
    with pytest.raises(ScenarioError) as info:
        case_from(software=software)
    assert key in str(info.value) and shown in str(info.value), str(info.value)


def test_torchrun_refuses_case_software_by_name():
    problem = incompatibility(case_from(software={"packages": ["six==1.16.0"]}))
    assert problem and "software {'python': None, 'packages': ['six==1.16.0']}" in problem


def observed(verdicts: dict[str, str], runs: list[str]):
    def run(version: str) -> Observation:
        runs.append(version)
        return Observation(version, verdicts[version], "", version)
    return run


def test_bisect_finds_the_neighbouring_releases_where_the_verdict_changes():
    releases = tuple(f"1.{minor}.0" for minor in range(20))
    verdicts = {v: "LOUD" if i < 13 else "RECOVERED" for i, v in enumerate(releases)}
    runs: list[str] = []
    made, boundary = search(releases, observed(verdicts, runs))
    assert (boundary[0].version, boundary[1].version) == ("1.12.0", "1.13.0")
    assert runs[:2] == ["1.0.0", "1.19.0"] and len(runs) <= 2 + 5  # the ends, then log2(20) rounded up
    assert [o.version for o in made] == runs


def test_bisect_stops_when_the_ends_agree():
    releases = ("1.0", "1.1", "1.2")
    runs: list[str] = []
    assert search(releases, observed(dict.fromkeys(releases, "SILENT"), runs))[1] is None
    assert runs == ["1.0", "1.2"]


def test_bisect_ranges_name_what_is_allowed():
    releases = ("0.9.0", "1.0.0", "1.1.0", "1.2.0")
    assert release_range("1.0.0..1.2.0", "lib", releases) == ("1.0.0", "1.1.0", "1.2.0")
    for text, shown in [("1.0.0", "not a range"), ("1.0.0..9.9", "9.9 is not a release of lib"),
                        ("1.2.0..1.0.0", "older release first")]:
        with pytest.raises(ValueError) as info:
            release_range(text, "lib", releases)
        assert shown in str(info.value) and ("allowed" in str(info.value) or "first" in str(info.value))


def test_bisect_layers_the_release_over_the_case_or_the_restart():
    case = case_from(software={"packages": ["six==1.16.0", "deepspeed==0.17.6"]})
    assert case_under(case, "deepspeed", "0.18.0", at_restart=False).software.packages == (
        "six==1.16.0", "deepspeed==0.18.0")
    at_restart = case_under(case_from(), "deepspeed", "0.18.0", at_restart=True)
    assert at_restart.restart.packages == ("deepspeed==0.18.0",) and not at_restart.software
    with pytest.raises(ValueError, match="names an interpreter of its own"):
        case_under(case_from(software={"python": "/usr/bin/python3"}), "deepspeed", "0.18.0", at_restart=False)
    assert one_line("\x1b[1mbold\x1b[0m\n  next") == "bold next"


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.minutes(2)
def test_bisect_finds_where_deepspeed_restores_a_checkpoint_under_this_torch():
    """DeepSpeed before 0.16.0 loads its files with torch.load's default, which torch 2.6 made
    weights_only=True: a restart under 0.15.x of a checkpoint this environment saved fails loudly."""
    command = [sys.executable, "-m", "resilience", "bisect", "scenarios/deepspeed_cross_version.scenario.yaml",
               "--case", "strategy=deepspeed.zero2", "--package", "deepspeed", "--versions", "0.15.0..0.16.0",
               "--restart"]
    if os.environ.get(REFERENCE_CACHE_ENV):
        command += ["--cache", os.environ[REFERENCE_CACHE_ENV]]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over 6 releases of deepspeed (0.15.0..0.16.0), layered under the restart" in done.stdout
    assert "boundary: deepspeed 0.15.4 gives LOUD, 0.16.0 gives RECOVERED" in done.stdout, done.stdout
    assert "deepspeed==0.15.4     LOUD        (imported 0.15.4) rank" in done.stdout
    assert "Weights only load failed" in done.stdout
    assert "deepspeed==0.16.0     RECOVERED   (imported 0.16.0)" in done.stdout
