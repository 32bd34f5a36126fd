"""Preemption: SIGTERM to some or all ranks at the trigger, a grace period, then SIGKILL; and the
emergency save a strategy may do on SIGTERM (complete, torn, or absent), judged after the restart."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from resilience.core.case import VerdictKind
from resilience.core.preemption import wanted_by
from resilience.run.harness import Harness
from resilience.run.reference_cache import ReferenceCache

from .harness_helpers import case_from
from .test_loader import scenario_error, variant

SIGTERM, SIGKILL = -signal.SIGTERM, -signal.SIGKILL


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One reference run for the whole module: every case here has the same workload."""
    return ReferenceCache(tmp_path_factory.mktemp("references"))


def run(tmp_path, cache, strategy="torch.per_rank", emergency=False, expect="recovers", **fault):
    fault = {"kind": "preempt", "rank": 1, "step": 6, "phase": "train", "point": "start", "grace": 10, **fault}
    options = {"save_on_sigterm": True} if emergency else {}
    case = case_from(strategy={"name": strategy, "options": options}, fault=fault, expect=expect,
                     workload={"steps": 12}, timeouts={"collective": 15, "phase": 120})
    result = Harness(work_root=tmp_path, keep=True, cache=cache).run(case)
    for phase in result.phases[1:]:
        for pid in {e["pid"] for rank in phase.ranks for e in rank.events}:
            assert not Path(f"/proc/{pid}").exists(), f"rank process {pid} of {phase.name} survived"
    return result


def events(phase, rank, *kinds):
    return [e for e in phase.ranks[rank].events if e["event"] in kinds]


def test_without_a_handler_sigterm_ends_the_ranks_at_once_and_the_restart_resumes_from_step_4(tmp_path, cache):
    result = run(tmp_path, cache)
    first_run = result.phases[1]
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert (result.verdict.restored_step, result.verdict.complete_step) == (4, 4)
    assert [r.returncode for r in first_run.ranks] == [SIGTERM, SIGTERM]
    assert first_run.status == "fault_killed" and first_run.first_error is None
    # the SIGTERM reached rank 1 where it reported the trigger: it never finished step 6
    assert max(e["step"] for e in events(first_run, 1, "loss")) == 5
    assert not events(first_run, 0, "preempted") and not events(first_run, 1, "preempted")


def test_emergency_save_completes_within_the_grace_and_the_restart_resumes_from_it(tmp_path, cache):
    result = run(tmp_path, cache, emergency=True)
    first_run = result.phases[1]
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert (result.verdict.restored_step, result.verdict.complete_step) == (6, 6)
    assert [r.returncode for r in first_run.ranks] == [SIGTERM, SIGTERM]  # no SIGKILL needed
    for rank in (0, 1):
        assert [(e["event"], e["step"], e.get("emergency")) for e in
                events(first_run, rank, "preempted", "save_begin", "save_returned")][-3:] == [
            ("preempted", 6, None), ("save_begin", 6, True), ("save_returned", 6, True)]
        assert events(first_run, rank, "preempted")[0]["signalled"] is True
    for rank in (0, 1):
        saved = torch.load(result.work_dir / "checkpoints" / "step_00000006" / f"ckpt_rank_{rank}.pt",
                           weights_only=True)
        assert saved["step"] == 6


def test_grace_too_short_leaves_a_torn_emergency_save_that_the_restart_loads_loudly(tmp_path, cache):
    result = run(tmp_path, cache, emergency=True, grace=2, after_bytes=4096, file="*_rank_1.pt",
                 expect="fails_loudly")
    first_run = result.phases[1]
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    error = result.verdict.first_error
    assert error.phase == "restart" and "failed finding central directory" in error.message
    assert [r.returncode for r in first_run.ranks] == [SIGKILL, SIGKILL]
    assert first_run.elapsed_s >= 2
    assert [(e["file"], e["offset"]) for e in events(first_run, 1, "write_stalled")] == [
        ("step_00000006/ckpt_rank_1.pt", 4096)]
    directory = result.work_dir / "checkpoints" / "step_00000006"
    assert (directory / "ckpt_rank_1.pt").stat().st_size == 4096  # cut exactly where the writes stalled
    assert torch.load(directory / "ckpt_rank_0.pt", weights_only=True)["step"] == 6
    assert result.verdict.complete_step == 4  # the emergency save never returned: not a checkpoint


def test_one_preempted_rank_brings_the_others_into_the_emergency_save(tmp_path, cache):
    """Only rank 1 gets SIGTERM; rank 0 learns of it from the flag all-reduced between steps."""
    result = run(tmp_path, cache, strategy="torch.rank0", emergency=True, ranks="trigger")
    first_run = result.phases[1]
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 6
    assert events(first_run, 0, "preempted")[0]["signalled"] is False
    assert events(first_run, 1, "preempted")[0]["signalled"] is True
    assert (result.work_dir / "checkpoints" / "step_00000006" / "model_optim.pt").exists()


def test_one_preempted_rank_without_a_handler_is_a_loss_the_peer_only_notices(tmp_path, cache):
    result = run(tmp_path, cache, ranks="trigger")
    first_run = result.phases[1]
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert result.verdict.restored_step == 4
    assert first_run.ranks[1].returncode == SIGTERM
    # rank 0 was not signalled: it failed on the lost peer, a consequence of the fault, not evidence
    assert first_run.ranks[0].returncode not in (None, 0, SIGTERM, SIGKILL)
    assert first_run.first_error is None


def test_sigterm_during_a_save_lets_the_save_finish_and_needs_no_emergency_save(tmp_path, cache):
    result = run(tmp_path, cache, strategy="torch.rank0", emergency=True, phase="save", step=8)
    first_run = result.phases[1]
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert (result.verdict.restored_step, result.verdict.complete_step) == (8, 8)
    for rank in (0, 1):
        assert [e["emergency_save"] for e in events(first_run, rank, "preempted")] == [False]
        assert not [e for e in events(first_run, rank, "save_begin") if e.get("emergency")]


def test_a_strategy_opts_in_by_method_or_option(tmp_path):
    from resilience.strategies.base import StrategyContext
    from resilience.strategies.torch.native import PerRankSave

    class AlwaysSaves(PerRankSave):
        def saves_on_sigterm(self) -> bool:
            return True

    class NeverSaves(PerRankSave):
        def saves_on_sigterm(self) -> bool:
            return False

    def context(options):
        return StrategyContext(checkpoint_dir=tmp_path, rank=0, world_size=1, previous_rank=None, options=options)

    assert not wanted_by(PerRankSave(context({})))
    assert wanted_by(PerRankSave(context({"save_on_sigterm": True})))
    assert wanted_by(AlwaysSaves(context({})))
    assert not wanted_by(NeverSaves(context({"save_on_sigterm": True})))


# -- scenario validation ------------------------------------------------------------------------------

PREEMPT_BASE = variant({"fault": {"kind": "preempt", "rank": 1, "step": 6, "phase": "train"}})


@pytest.mark.parametrize("changes,key,value,allowed", [
    ({"fault.ranks": "some"}, "fault.ranks", "some", "all, trigger"),
    ({"fault.ranks": 1}, "fault.ranks", 1, "all, trigger"),
    ({"fault.grace": 0}, "fault.grace", 0, None),
    ({"fault.grace": "30s"}, "fault.grace", "30s", None),
    ({"fault.point": "write"}, "fault.point", "write", "start"),
    ({"fault.phase": "load"}, "fault.phase", "load", "train, save"),
    ({"fault.seconds": 3}, "fault.seconds", "seconds", "ranks, grace"),
    ({"strategy": {"name": "none", "options": {"save_on_sigterm": True}}}, "strategy.options.save_on_sigterm",
     "save_on_sigterm", None),
    ({"strategy": {"name": "torch.rank0", "options": {"save_on_sigterm": "yes"}}},
     "strategy.options.save_on_sigterm", "yes", "True, False"),
], ids=["unknown ranks", "ranks a number", "zero grace", "grace with a unit", "point other than start",
        "unknown phase", "a stall's key", "a strategy that cannot save on SIGTERM", "save_on_sigterm not a bool"])
def test_bad_preempt_fault_names_file_key_value_and_allowed(changes, key, value, allowed):
    err = scenario_error(variant(changes, base=PREEMPT_BASE))
    assert err.key == key, str(err)
    assert err.value == value, str(err)
    if allowed is not None:
        assert allowed in err.allowed, str(err)


def test_preempt_defaults_and_after_bytes_at_the_start():
    from resilience.scenario.loader import load_document

    changes = {"fault.after_bytes": "4KiB", "fault.point": "start"}
    case = load_document(variant(changes, base=PREEMPT_BASE), "x.scenario.yaml").cases[0]
    assert case.fault.params == {"ranks": "all", "grace": 30.0}  # Kubernetes' default grace period
    assert (case.fault.trigger.point, case.fault.trigger.after_bytes) == ("start", 4096)


def test_after_bytes_alone_means_the_only_point_start():
    from resilience.scenario.loader import load_document

    case = load_document(variant({"fault.after_bytes": 4096}, base=PREEMPT_BASE), "x.scenario.yaml").cases[0]
    assert (case.fault.trigger.point, case.fault.trigger.after_bytes) == ("start", 4096)
