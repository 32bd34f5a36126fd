"""Fault-injection resilience tests for distributed PyTorch checkpointing.

The public API, for plug-in authors and for running cases from Python. Names load on first use,
so ``import resilience`` imports neither torch nor the harness::

    from resilience import CheckpointStrategy, Harness, load_file, judge_case

    for case in load_file("scenarios/no_fault.scenario.yaml").cases:
        print(judge_case(Harness().run(case)).status)

Where each part of the code lives: docs/architecture.md.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    # plug-in contracts
    "CheckpointStrategy": "resilience.strategies.base",
    "StrategyContext": "resilience.strategies.base",
    "Fault": "resilience.faults.base",
    "RankEnvironment": "resilience.faults.base",
    "CaseEnvironment": "resilience.faults.base",
    "Workload": "resilience.workloads.base",
    "TrainableWorkload": "resilience.workloads.base",
    # scenarios and cases
    "load_file": "resilience.scenario.loader",
    "load_document": "resilience.scenario.loader",
    "Case": "resilience.core.case",
    "Scenario": "resilience.core.case",
    "VerdictKind": "resilience.core.case",
    # running and judging
    "Harness": "resilience.run.harness",
    "run_case_under_torchrun": "resilience.run.torchrun",
    "verify_checkpoint": "resilience.run.checkpoint_verify",
    "CaseResult": "resilience.core.records",
    "PhaseResult": "resilience.core.records",
    "RankError": "resilience.core.records",
    "Verdict": "resilience.core.records",
    "judge_case": "resilience.oracle.outcome",
    "CaseOutcome": "resilience.oracle.outcome",
    # errors
    "ResilienceError": "resilience.errors",
    "ScenarioError": "resilience.errors",
    "PluginError": "resilience.errors",
    "HarnessError": "resilience.errors",
    "Unavailable": "resilience.errors",
    "StrategyUnavailable": "resilience.errors",
    "FaultUnavailable": "resilience.errors",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'resilience' has no attribute {name!r}; public names: {', '.join(__all__)}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
