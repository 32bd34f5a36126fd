"""The Hugging Face Trainer as the system under test (strategy hf_trainer; skipped, with the reason,
where transformers is missing; CI=true turns that skip into a failure)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from resilience.core.case import VerdictKind
from resilience.core.plan import REFERENCE, RESTART

from .harness_helpers import run_case

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed: pip install -e '.[transformers]'")
TRAINER = {"name": "hf_trainer"}
KILL = {"kind": "kill", "rank": 1, "step": 6, "phase": "train"}


@needs_transformers
def test_a_kill_between_saves_recovers_bitwise_with_the_samples_the_reference_trained(tmp_path):
    """Killed at step 6, the restart resumes from checkpoint-4 and trains steps 5..8 with the
    reference's losses, bit for bit, on the same samples (read off each batch by the collator)."""
    result = run_case(tmp_path, strategy=TRAINER, fault=KILL)
    assert result.verdict.kind == VerdictKind.RECOVERED, result.verdict
    assert result.verdict.restored_step == 4
    reference, restart = result.phase(REFERENCE), result.phase(RESTART)
    for rank in range(2):
        after = {step: loss for step, loss in restart.losses(rank).items() if step > 4}
        assert sorted(after) == [5, 6, 7, 8]
        assert after == {step: reference.losses(rank)[step] for step in after}
    assert restart.losses(0) == restart.losses(1)  # the Trainer's gathered loss: the global one
    samples = {e["step"]: e["samples"] for e in restart.ranks[1].events if e["event"] == "loss"}
    expected = {e["step"]: e["samples"] for e in reference.ranks[1].events if e["event"] == "loss"}
    assert samples and all(samples[step] == expected[step] for step in samples)


@needs_transformers
def test_resuming_a_finished_run_trains_a_step_past_max_steps(tmp_path):
    """The pinned weakness of the no-fault case: restored at step 8 = max_steps, the Trainer trains
    step 9 before its stop check (trainer.py:1877, trainer_callback.py:592 in 5.24.0)."""
    result = run_case(tmp_path, strategy=TRAINER)
    assert result.verdict.kind == VerdictKind.SILENT, result.verdict
    assert result.verdict.restored_step == 8
    assert max(result.phase(RESTART).losses(0)) == 9


def test_loading_the_scenario_imports_no_transformers():
    """The harness process stays free of the library: only ranks import it."""
    code = ("import sys; from resilience.scenario.loader import load_file\n"
            "from resilience.core import registry\n"
            "cases = load_file('scenarios/hf_trainer.scenario.yaml').cases\n"
            "strategy = registry.resolve('strategy', cases[0].strategy.name)\n"
            "strategy.missing(); strategy.trainer(cases[0].strategy.options)\n"
            "assert 'transformers' not in sys.modules, 'transformers imported'\n"
            "print(len(cases))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) >= 10


def test_without_the_library_a_case_names_the_install_command(monkeypatch):
    from resilience.core import registry
    from resilience.errors import StrategyUnavailable
    from resilience.run.harness import Harness

    from .harness_helpers import case_from

    strategy = registry.resolve("strategy", "hf_trainer")
    monkeypatch.setattr(strategy, "requires", {"transformers_is_not_here": "pip install 'resilience[transformers]'"})
    with pytest.raises(StrategyUnavailable) as info:
        Harness().run(case_from(strategy="hf_trainer"))
    assert "transformers_is_not_here is not installed (pip install 'resilience[transformers]')" in str(info.value)
