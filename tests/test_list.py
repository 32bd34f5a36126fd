"""`resilience list strategies|faults|workloads`: every registered plug-in, its options and one line of doc."""
from __future__ import annotations

import pytest

from resilience.commands import cli
from resilience.commands.catalog import entries, first_sentence
from resilience.core import registry


def listing(capsys, what: str) -> str:
    assert cli.main(["list", what]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("what, kind", [("strategies", "strategy"), ("faults", "fault"), ("workloads", "workload")])
def test_every_registered_plugin_is_listed_with_a_summary(capsys, what, kind):
    out = listing(capsys, what)
    lines = out.splitlines()
    for name in registry.TABLES[kind]:
        line = next((line for line in lines if line.split(" ", 1)[0] == name), None)
        assert line is not None, f"{name} missing from:\n{out}"
        assert len(line.split(None, 1)[1]) > 20  # a real sentence, not an empty doc
    assert "package.module:Class" in out


def test_strategy_options_and_allowed_values_are_listed(capsys):
    out = listing(capsys, "strategies")
    assert "options.stagger: an integer >= 1" in out
    assert "options.restore: native | universal" in out
    assert "options.check_version: True | False" in out


def test_fault_parameters_and_trigger_points_are_listed(capsys):
    out = listing(capsys, "faults")
    assert "via: quota | tmpfs (default quota)" in out
    assert "seconds: a number > 0" in out
    assert "save: start | open | write | fsync | close" in out


def test_summary_comes_from_the_class_or_its_module():
    by_name = {e.name: e for e in entries("fault")}
    assert by_name["kill"].summary.startswith("SIGKILL of a rank's own process")  # its class doc opens a list
    assert by_name["none"].summary == first_sentence(registry.resolve("fault", "none"))
    assert all(not e.summary.startswith("A fault: what goes wrong") for e in by_name.values())


def test_unknown_kind_is_refused_with_the_allowed_ones(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["list", "things"])
    assert exited.value.code == 2
    assert "strategies" in capsys.readouterr().err


def test_an_abbreviation_does_not_end_the_summary():
    class Documented:
        """Rewrites the pointer (e.g. DeepSpeed's latest) to an older tag. Then more."""

    assert first_sentence(Documented) == "Rewrites the pointer (e.g. DeepSpeed's latest) to an older tag."
