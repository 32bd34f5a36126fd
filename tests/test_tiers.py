"""The deep tier (``tier: deep``): left out by the main job, `run`, `explore`, `repeat` and
`qualify`, run where asked (``-m deep``, ``--deep``, or a case named by its id)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from resilience.commands.case_loop import selection
from resilience.commands.qualify_cases import select
from resilience.core import registry
from resilience.core.case import Case
from resilience.scenario.discovery import load_all_cases
from resilience.scenario.loader import load_file

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "hf_trainer.scenario.yaml"  # one deep case among many


def test_run_leaves_the_deep_tier_out_unless_asked_or_named():
    cases = load_file(SCENARIO).cases
    deep = [case for case in cases if case.tier == "deep"]
    assert len(deep) == 1 and len(cases) > 20
    assert [case for case in cases if selection(None, deep=False)(case)] == [c for c in cases if c.tier != "deep"]
    assert [case for case in cases if selection(None, deep=True)(case)] == list(cases)
    assert [case for case in cases if selection(deep[0].id, deep=False)(case)] == deep


def test_qualify_selects_as_run_does():
    chosen, errors = select([str(SCENARIO)], None)
    assert not errors and all(case.tier != "deep" for case in chosen)
    with_deep, _ = select([str(SCENARIO)], None, deep=True)
    assert len(with_deep) == len(chosen) + 1


def test_pytest_deselects_the_deep_tier_unless_the_marker_is_named():
    def collected(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "pytest", str(SCENARIO), "--collect-only", "-q",
                               "-p", "no:cacheprovider", *extra], capture_output=True, text=True, cwd=ROOT,
                              timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
        return done.stdout.strip().splitlines()[-1]

    cases = len(load_file(SCENARIO).cases)
    assert collected().startswith(f"{cases - 1}/{cases} tests collected (1 deselected)")
    assert collected("-m", "deep").startswith(f"1/{cases} tests collected ({cases - 1} deselected)")


def family(kind: str) -> str:
    """A fault's family: its package under resilience.faults (``process``, ``write_path``, ...)."""
    module = registry.FAULTS[kind].split(":")[0].split(".")
    return module[2] if len(module) > 3 else module[-1]


def pairs(cases) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for case in cases:
        system = case.strategy.name if isinstance(case, Case) else Path(case.script.path).name
        kinds = [case.fault.kind] + [launch.fault.kind for launch in getattr(case, "incarnations", ())]
        for kind in kinds:
            found.setdefault((system, family(kind)), []).append(case.tier)
    return found


def test_every_strategy_and_fault_family_keeps_a_case_in_the_main_job():
    cases, errors = load_all_cases([ROOT / "scenarios"])
    assert not errors and cases
    only_deep = sorted(pair for pair, tiers in pairs(cases).items() if set(tiers) == {"deep"})
    assert only_deep == [], f"every case of these strategy x fault family pairs is deep: {only_deep}"
    assert any(tier == "deep" for tiers in pairs(cases).values() for tier in tiers)  # the rule has work to do
