"""The Hugging Face Trainer as the system under test (strategy hf_trainer; skipped, with the reason,
where transformers is missing; CI=true turns that skip into a failure)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from resilience.core.case import VerdictKind
from resilience.core.plan import FALLBACK, FIRST_RUN, REFERENCE, RESTART
from resilience.errors import ScenarioError

from .harness_helpers import case_from, run_case

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
    assert not [finding for finding in result.verdict.findings if finding.startswith("data:")]


@needs_transformers
def test_the_data_audit_names_the_samples_a_resume_without_data_skip_repeats_and_skips(tmp_path):
    """The planted twin of the case above: the same kill with the Trainer's own
    ``ignore_data_skip`` (the resumed epoch starts at its first batch, trainer.py:1851). The losses
    differ, and the data audit names the dataset indices trained twice and those never trained."""
    options = {"ignore_data_skip": True}
    result = run_case(tmp_path, strategy={**TRAINER, "options": options}, fault=KILL)
    assert result.verdict.kind == VerdictKind.SILENT, result.verdict
    data = [finding for finding in result.verdict.findings if finding.startswith("data:")]
    twice = [finding for finding in data if "trained twice" in finding]
    never = [finding for finding in data if "never trained" in finding]
    assert twice and never, data
    assert "after the restore at step 4" in twice[0] and "dataset indices" in twice[0]


@needs_transformers
def test_a_refused_restore_is_probed_with_the_trainers_own_resume_from_a_chosen_folder(tmp_path):
    """Killed 64 bytes into checkpoint-8/config.json (the save's first file), the restart takes the
    torn folder and refuses; the availability probe resumes fresh ranks from checkpoint-4 with
    ``resume_from_checkpoint=<checkpoint-4>`` and proves it intact bitwise."""
    fault = {"kind": "kill", "rank": 0, "step": 8, "phase": "save", "point": "write",
             "file": "checkpoint-8/config.json", "after_bytes": 64}
    result = run_case(tmp_path, strategy=TRAINER, fault=fault)
    assert result.verdict.kind == VerdictKind.LOUD, result.verdict
    assert "Can't find a valid checkpoint" in str(result.verdict.first_error)
    assert result.verdict.intact_step == 4
    probe = result.phase(FALLBACK)
    assert {event["step"] for event in probe.restored().values()} == {4}
    assert probe.losses(0) == {step: loss for step, loss in result.phase(REFERENCE).losses(0).items() if step > 4}


@needs_transformers
def test_a_kill_between_the_micro_batches_of_a_step_fires_there_and_recovers(tmp_path):
    """With ``gradient_accumulation_steps: 2`` the Trainer calls ``on_substep_end`` after the first
    micro-batch of each step; a kill at point ``micro_step`` fires there (the step's loss never
    logged) and the restart from checkpoint-4 recovers bitwise."""
    options = {"gradient_accumulation_steps": 2}
    fault = {**KILL, "point": "micro_step"}
    result = run_case(tmp_path, strategy={**TRAINER, "options": options}, fault=fault)
    assert result.verdict.kind == VerdictKind.RECOVERED, result.verdict
    first_run = result.phase(FIRST_RUN)
    fired = first_run.events("fault_fired")
    assert [(event["step"], event["phase"], event["point"]) for event in fired] == [(6, "train", "micro_step")]
    assert max(first_run.losses(1)) == 5


def test_a_micro_step_point_needs_a_loop_that_accumulates():
    fault = {**KILL, "point": "micro_step"}
    with pytest.raises(ScenarioError, match=r"fault\.point.*one micro-batch a step.*gradient_accumulation_steps"):
        case_from(strategy=TRAINER, fault=fault)
    with pytest.raises(ScenarioError, match=r"fault\.point.*torch\.per_rank"):
        case_from(fault=fault)
    with pytest.raises(ScenarioError, match=r"fault\.point"):
        case_from(strategy={**TRAINER, "options": {"gradient_accumulation_steps": 2}},
                  fault={"kind": "stall", "rank": 1, "step": 6, "phase": "train", "point": "micro_step",
                         "seconds": 1})


@pytest.mark.parametrize(("options", "message"), [
    ({"model": "LlamaForCausalLM"}, r"strategy\.options\.model.*package\.module:Class"),
    ({"model_config": {"hidden_size": 8}}, r"strategy\.options\.model_config.*model: package\.module:Class"),
    ({"model": "transformers:LlamaForCausalLM", "dropout": 0.1}, r"strategy\.options\.dropout.*model_config"),
    ({"load_best_model_at_end": True}, r"load_best_model_at_end.*eval_steps"),
    ({"training_arguments": {"save_steps": 2}}, r"training_arguments\.save_steps.*set by the harness"),
    ({"training_arguments": {"seed": 2}}, r"training_arguments\.seed.*strategy\.options\.seed"),
    ({"training_arguments": ["weight_decay"]}, r"training_arguments.*must map"),
    ({"ignore_data_skip": "yes"}, r"strategy\.options\.ignore_data_skip.*allowed"),
])
def test_bad_options_name_the_key_the_value_and_what_is_allowed(options, message):
    with pytest.raises(ScenarioError, match=message):
        case_from(strategy={**TRAINER, "options": options})


def test_a_manifest_refuses_a_library_that_saves_inside_its_own_loop():
    with pytest.raises(ScenarioError, match=r"strategy\.options\.inner.*own loop"):
        case_from(strategy={"name": "manifest", "options": {"inner": "hf_trainer"}})


@needs_transformers
def test_training_arguments_override_the_strategys_defaults(tmp_path):
    """``learning_rate`` has a default of the strategy's (1e-2); the user's value replaces it, so
    the first loss after step 1 differs from the default run's, and the case still recovers."""
    options = {"training_arguments": {"learning_rate": 0.05}}
    result = run_case(tmp_path, strategy={**TRAINER, "options": options}, fault=KILL)
    assert result.verdict.kind == VerdictKind.RECOVERED, result.verdict
    default = run_case(tmp_path / "default", strategy=TRAINER, fault=KILL)
    assert result.phase(REFERENCE).losses(0)[1] == default.phase(REFERENCE).losses(0)[1]  # before any update
    assert result.phase(REFERENCE).losses(0)[3] != default.phase(REFERENCE).losses(0)[3]


@needs_transformers
def test_training_arguments_are_checked_against_the_fields_of_TrainingArguments():
    with pytest.raises(ScenarioError, match=r"training_arguments\.weight_decy.*not a TrainingArguments field"):
        case_from(strategy={**TRAINER, "options": {"training_arguments": {"weight_decy": 0.1}}})
    case_from(strategy={**TRAINER, "options": {"training_arguments": {"weight_decay": 0.1}}})


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
