"""A user's own LightningModule qualified by naming it in a scenario (skipped, with the reason,
where Lightning is missing; CI=true turns that skip into a failure)."""
from __future__ import annotations

import importlib.util

import pytest

from resilience.core.case import VerdictKind

from .harness_helpers import run_case

needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("pytorch_lightning") is None or importlib.util.find_spec("torchdata") is None,
    reason="pytorch_lightning is not installed: pip install -e '.[lightning]'")
KILL = {"kind": "kill", "rank": 1, "step": 6, "phase": "train"}


@needs_lightning
@pytest.mark.parametrize("module, verdict", [("TinyRegression", VerdictKind.RECOVERED),
                                             ("ForgetsItsScale", VerdictKind.SILENT)])
def test_a_users_lightning_module_is_qualified_without_changing_it(tmp_path, module, verdict):
    """The correct module recovers bitwise from step 4; its twin, whose loss scale lives in a
    non-persistent buffer, restores the same state digests but trains on with another scale: SILENT."""
    result = run_case(tmp_path, strategy={"name": "lightning",
                                          "options": {"module": f"tests.lightning_user_modules:{module}"}},
                      fault=KILL)
    assert result.verdict.kind == verdict, result.verdict
    assert result.verdict.restored_step == 4


needs_accelerate = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                      reason="accelerate is not installed: pip install -e '.[accelerate]'")


@needs_accelerate
@pytest.mark.parametrize("prepare_scheduler, verdict", [(True, VerdictKind.RECOVERED), (False, VerdictKind.SILENT)])
def test_a_users_accelerate_function_is_qualified_without_changing_it(tmp_path, prepare_scheduler, verdict):
    """The function that prepares its scheduler recovers bitwise from step 4; its twin, whose
    scheduler save_state never stores, restores the same state digests and trains on with the
    schedule from its start: SILENT."""
    options = {"function": "tests.accelerate_user_functions:train",
               "arguments": {"steps": 8, "save_every": 4, "prepare_scheduler": prepare_scheduler}}
    result = run_case(tmp_path, strategy={"name": "accelerate", "options": options}, fault=KILL)
    assert result.verdict.kind == verdict, result.verdict
    assert result.verdict.restored_step == 4


@pytest.mark.parametrize("name, extra", [("lightning", "lightning"), ("accelerate", "accelerate")])
def test_without_the_library_a_case_names_the_install_command(monkeypatch, name, extra):
    """The strategy's requirement is checked in the harness before any rank starts; the pytest
    plugin turns StrategyUnavailable into a skip (a failure under CI=true)."""
    from resilience.core import registry
    from resilience.errors import StrategyUnavailable
    from resilience.run.harness import Harness

    from .harness_helpers import case_from

    strategy = registry.resolve("strategy", name)
    monkeypatch.setattr(strategy, "requires", {f"{name}_is_not_here": f"pip install 'resilience[{extra}]'"})
    with pytest.raises(StrategyUnavailable) as info:
        Harness().run(case_from(strategy=name))
    assert f"{name}_is_not_here is not installed (pip install 'resilience[{extra}]')" in str(info.value)
