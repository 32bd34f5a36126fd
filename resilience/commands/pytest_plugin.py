"""pytest plugin: collects `*.scenario.yaml` files (and nothing else) and runs one item per case."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ..core import compile_cache
from ..core.case import Case
from ..core.interrupts import end_like_ctrl_c_on_sigterm
from ..core.processes import tree_cpu_seconds
from ..core.records import CaseResult
from ..core.script_case import ScriptCase
from ..errors import CaseFailed, HarnessError, ScenarioError, Unavailable
from ..faults.base import FaultUnavailable
from ..launch.backend import BACKENDS, DEFAULT_BACKEND
from ..oracle.outcome import CaseStatus, judge_case, judge_outcome
from ..report.text import render
from ..run.blackbox import describe, run_script_case
from ..run.harness import Harness
from ..run.reference_cache import ReferenceCache, default_cache_dir
from ..scenario import selection
from ..scenario.discovery import is_scenario_file
from ..scenario.loader import load_any_file
from . import case_durations
from .case_loop import skips_fail


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("resilience", "fault-injection checkpoint scenarios")
    group.addoption("--resilience-keep", action="store_true", help="keep each case's work directory")
    group.addoption("--resilience-workdir", type=Path, default=None, help="where case work directories go")
    group.addoption("--resilience-backend", default=DEFAULT_BACKEND, choices=sorted(BACKENDS),
                    help="how rank processes are started: fork (from a server with torch preloaded) "
                         "or spawn (a fresh interpreter per rank)")
    group.addoption("--resilience-cache", type=Path, default=None,
                    help="reference-run cache directory (default: $RESILIENCE_CACHE or ~/.cache/resilience)")
    group.addoption("--resilience-no-cache", action="store_true", help="run the reference in every case")


def pytest_configure(config: pytest.Config) -> None:
    end_like_ctrl_c_on_sigterm()  # a CI time limit's SIGTERM tears a case down as Ctrl-C does
    compile_cache.keep_in_this_run()  # xdist's workers, started after this, inherit it
    config.addinivalue_line("markers", "smoke: the scenario's CI tier (tier: smoke)")
    config.addinivalue_line("markers", "deep: a costly case (tier: deep), run only when -m names it: -m deep")
    config.addinivalue_line("markers", "scenario: a case from a resilience scenario file")
    config.addinivalue_line("markers", "script: a case on a user's own training script (black-box mode)")
    config.addinivalue_line("markers", f"{selection.MARKER}(key=value, ...): a case's values, for -m "
                                       f"\"{selection.MARKER}(strategy='torch.rank0', fault_seconds=3)\"")
    if "=" in (config.option.keyword or ""):  # pytest would refuse it (under xdist: an INTERNALERROR)
        raise pytest.UsageError(selection.keyword_hint(config.option.keyword))
    if not hasattr(config, "workerinput"):  # a worker's reports reach the controller's hooks too
        config.pluginmanager.register(DurationRecorder(_durations_path(config)), "resilience-durations")
        if hasattr(config.option, "maxschedchunk") and config.option.maxschedchunk is None:  # xdist, not given
            # xdist hands each worker its next case when it starts one (not a quarter of the run at
            # once), so the order below is the order cases start in and neighbours run side by side
            config.option.maxschedchunk = 1


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if is_scenario_file(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cases of the deep tier run only where ``-m`` names them (``-m deep``); otherwise they are
    deselected, as ``-m "not deep"`` would, and counted as such. The cases then run longest first,
    by what the last run recorded, those that mostly wait spaced apart (`case_durations`; a case
    never seen goes first)."""
    if not re.search(r"\bdeep\b", config.option.markexpr or ""):  # the marker, not strategy_deepspeed
        deep = [item for item in items if item.get_closest_marker("deep")]
        if deep:
            config.hook.pytest_deselected(items=deep)
            items[:] = [item for item in items if not item.get_closest_marker("deep")]
    recorded = case_durations.from_records(config.workerinput.get(DURATIONS_INPUT, {})) \
        if hasattr(config, "workerinput") else case_durations.read(_durations_path(config))
    items[:] = case_durations.run_order(items, recorded,
                                        lambda item: item.nodeid if isinstance(item, CaseItem) else None)


DURATIONS_INPUT = "resilience_durations"  # the controller's one reading, handed to every xdist worker


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(xdist, in the controller) Every worker orders the cases by the same reading of the durations,
    as xdist requires, even if another run replaces the file meanwhile."""
    node.workerinput[DURATIONS_INPUT] = case_durations.as_records(case_durations.read(_durations_path(node.config)))


def _durations_path(config: pytest.Config) -> Path:
    return case_durations.durations_path(config.option.resilience_cache or default_cache_dir())


CPU_PROPERTY = "cpu_seconds"  # a case's report property: what its processes spent running it


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """(where the case runs: a worker, or a run without workers) The CPU seconds this process and
    the processes it started spent on the case: its ranks (reaped by a fork server of this
    process), torchrun and its workers, the servers it talks to."""
    if not isinstance(item, CaseItem):
        yield
        return
    before = tree_cpu_seconds(os.getpid())
    yield
    item.user_properties.append((CPU_PROPERTY, round(tree_cpu_seconds(os.getpid()) - before, 2)))


class DurationRecorder:
    """In the run's controller (or a run without workers): each case's seconds and CPU seconds,
    written at the run's end."""

    def __init__(self, path: Path):
        self.path, self.measured = path, {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "scenario" not in report.keywords:
            return
        last = self.measured.get(report.nodeid, case_durations.CaseCost(0.0))
        cpu = dict(report.user_properties).get(CPU_PROPERTY, last.cpu_seconds)  # the call's report has it
        self.measured[report.nodeid] = case_durations.CaseCost(last.seconds + report.duration, cpu)

    def pytest_sessionfinish(self) -> None:
        case_durations.write(self.path, self.measured)


def fail_skips_in_ci(report: pytest.TestReport) -> None:
    """With CI=true a skip is a failure: a missing install step must not hide behind it."""
    if skips_fail() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true), which counts as a failure: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    if isinstance(item, (ScenarioItem, ScriptItem)):  # only our own items: other suites keep their skips
        fail_skips_in_ci(outcome.get_result())


def marker_name(prefix: str, value: str) -> str:
    return f"{prefix}_{re.sub(r'[^0-9A-Za-z]+', '_', value).strip('_')}"


class ScenarioFile(pytest.File):
    def collect(self):
        try:
            scenario = load_any_file(self.path)
        except ScenarioError:
            # A bad file is this file's collection error; the other files still run.
            self.config.option.continue_on_collection_errors = True
            raise
        if isinstance(scenario, tuple):  # cases on a user's own script
            for case in scenario:
                item = ScriptItem.from_parent(self, name=case.id, case=case)
                marker = marker_name("fault", case.fault.kind)
                self.config.addinivalue_line("markers", f"{marker}: generated from scenario files")
                item.add_marker(marker)
                item.add_marker("scenario")
                item.add_marker("script")
                item.add_marker(getattr(pytest.mark, selection.MARKER)(**selection.selection_values(case)))
                if case.tier in ("smoke", "deep"):
                    item.add_marker(case.tier)
                yield item
            return
        for case in scenario.cases:
            item = ScenarioItem.from_parent(self, name=case.id, case=case)
            for marker in (marker_name("strategy", case.strategy.name), marker_name("fault", case.fault.kind)):
                self.config.addinivalue_line("markers", f"{marker}: generated from scenario files")
                item.add_marker(marker)
            item.add_marker("scenario")
            item.add_marker(getattr(pytest.mark, selection.MARKER)(**selection.selection_values(case)))
            if case.tier in ("smoke", "deep"):
                item.add_marker(case.tier)
            yield item

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(ScenarioError):
            return f"malformed scenario: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)


class CaseItem(pytest.Item):
    """What a case item of either kind reports: its own failure text, its name and id."""

    case: Case | ScriptCase

    def reference_cache(self) -> ReferenceCache | None:
        """Where the uninterrupted runs are cached (``--resilience-no-cache``: nowhere)."""
        options = self.config.option
        return None if options.resilience_no_cache else ReferenceCache(options.resilience_cache or default_cache_dir())

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance((CaseFailed, HarnessError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"{self.case.name} [{self.case.id}]"


class ScenarioItem(CaseItem):
    def __init__(self, *, case: Case, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.result: CaseResult | None = None

    def runtest(self) -> None:
        options = self.config.option
        harness = Harness(backend=BACKENDS[options.resilience_backend](), work_root=options.resilience_workdir,
                          keep=options.resilience_keep, cache=self.reference_cache())
        try:
            self.result = harness.run(self.case)
        except FaultUnavailable as exc:
            pytest.skip(f"fault {self.case.fault.kind} unavailable here: {exc}")
        except Unavailable as exc:
            pytest.skip(str(exc))
        self._attach_logs(self.result)
        outcome = judge_case(self.result)
        self.user_properties.append(("verdict", self.result.verdict.kind.value))
        if outcome.status == CaseStatus.XFAILED:
            pytest.xfail(outcome.reason)
        if outcome.status == CaseStatus.FAILED:
            raise CaseFailed(render(self.result, outcome.reason))

    def _attach_logs(self, result: CaseResult) -> None:
        for phase in result.phases:
            for record in phase.ranks:
                if record.stderr_tail.strip():
                    self.add_report_section("call", f"{phase.name} rank {record.rank} stderr", record.stderr_tail)


class ScriptItem(CaseItem):
    """A case on a user's own script: black-box mode (`run.blackbox`), judged by the same rules."""

    def __init__(self, *, case: ScriptCase, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def runtest(self) -> None:
        options = self.config.option
        try:
            result = run_script_case(self.case, work_root=options.resilience_workdir, keep=options.resilience_keep,
                                     cache=self.reference_cache())
        except FaultUnavailable as exc:
            pytest.skip(f"fault {self.case.fault.kind} unavailable here: {exc}")
        except Unavailable as exc:  # several nodes without root
            pytest.skip(str(exc))
        self.user_properties.append(("verdict", result.verdict.kind.value))
        outcome = judge_outcome(self.case, result.verdict, result.fault_fired)
        if outcome.status == CaseStatus.XFAILED:
            pytest.xfail(outcome.reason)
        if outcome.status == CaseStatus.FAILED:
            raise CaseFailed(f"{self.case.source} [{self.case.id}] {self.case.name}: {outcome.reason}\n"
                             f"{describe(result)}")
