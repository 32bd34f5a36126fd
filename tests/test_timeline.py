"""Timelines (`resilience.scenario.timeline`): several launches of one job in a case, each restoring
from the launches before it with a fault of its own, judged launch by launch. Real ranks and files."""
from __future__ import annotations

import pytest

from resilience.core.plan import RESTART
from resilience.errors import ScenarioError
from resilience.planted.catalogue import BUGS, CATCHERS
from resilience.planted.trials import run_trial
from resilience.run.harness import Harness
from resilience.scenario.loader import load_document

BASE = {"name": "t", "strategy": "torch.per_rank",
        "workload": {"model": "mlp", "world_size": 2, "steps": 16, "checkpoint_every": 4, "seed": 0},
        "expect": "recovers", "timeouts": {"phase": 60}}
KILLS = [{"fault": {"kind": "kill", "rank": 1, "step": 6, "phase": "train"}},
         {"fault": {"kind": "kill", "rank": 0, "step": 10, "phase": "train"}}, {}]


def problem(**changes) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_document({**BASE, **changes}, "t.yaml")
    return str(caught.value)


def test_a_timeline_lowers_to_the_first_run_the_restart_and_later_launches():
    case = load_document({**BASE, "timeline": KILLS}, "t.yaml").cases[0]
    assert case.fault.kind == "kill" and case.fault.trigger.step == 6
    assert [(i.fault.kind, i.restart.world_size) for i in case.incarnations] == [("kill", 2), ("none", 2)]
    assert case.restart == case.incarnations[0].restart
    second = load_document(case.incarnation_document(1), "t.yaml").cases[0]  # as the restart's ranks read it
    assert second.fault.trigger.step == 10 and second.fault.trigger.rank == 0 and not second.timeline
    plain = load_document({**BASE, "fault": KILLS[0]["fault"]}, "t.yaml").cases[0]
    assert [i.fault.kind for i in plain.incarnations] == ["none"]  # restart: the short form


def test_timeline_mistakes_name_the_entry_key_value_and_what_is_allowed():
    assert "t.yaml: fault: beside a timeline" in problem(timeline=KILLS, fault="kill")
    disk = problem(timeline=[KILLS[0], {"fault": {"kind": "disk_full", "rank": 0, "step": 12, "after_bytes": 64}}, {}])
    assert "timeline.1.fault.kind: cannot be armed in a later launch" in disk
    assert "allowed: crash, kill, none, preempt" in disk
    assert "timeline.2.fault: the last launch runs the job to its end" in problem(timeline=KILLS[:2] + [KILLS[1]])
    assert "timeline.1.fault.rank: " in problem(timeline=[KILLS[0], {"fault": {"kind": "kill", "rank": 5,
                                                                                "step": 10}}, {}])
    assert "timeline.1.fault.rank: out of range; got 1; allowed: 0..0 (timeline.1.world_size is 1)" in problem(
        timeline=[KILLS[0], {"world_size": 1, "fault": {**KILLS[1]["fault"], "rank": 1}}, {}])
    smaller = load_document({**BASE, "timeline": [KILLS[0], {"world_size": 1, "packages": ["six==1.16.0"]}]},
                            "t.yaml").cases[0]
    assert smaller.incarnations[0].restart.world_size == 1 and smaller.launch_software(1).packages == ("six==1.16.0",)
    assert "timeline: must list 2 to 16 launches" in problem(timeline=KILLS[:1])
    read_error = {"fault": {"kind": "read_error", "rank": 1, "step": 8}}
    assert "timeline.1.fault: the first run's read_error fault acts in the restart too" in problem(
        timeline=[read_error, KILLS[1], {}])
    case = load_document({**BASE, "timeline": [read_error, {}]}, "t.yaml").cases[0]
    assert case.incarnation_document(1)["fault"]["kind"] == "read_error"  # armed there, as in the short form


def test_matrix_keys_reach_into_a_timeline_by_index():
    scenario = load_document({**BASE, "timeline": KILLS, "matrix": {"timeline.1.fault.step": [9, 11]}}, "t.yaml")
    assert [c.incarnations[0].fault.trigger.step for c in scenario.cases] == [9, 11]
    with pytest.raises(ScenarioError, match="timeline has no entry 7"):
        load_document({**BASE, "timeline": KILLS, "matrix": {"timeline.7.fault.step": [9]}}, "t.yaml")


def test_each_launch_restores_the_newest_save_of_the_launches_before_it(tmp_path):
    result = Harness(work_root=tmp_path).run(load_document({**BASE, "timeline": KILLS}, "t.yaml").cases[0])
    phases = {p.name: p for p in result.phases}
    assert [p.name for p in result.phases] == ["reference", "first_run", RESTART, f"{RESTART}_2"]
    assert phases["first_run"].status == phases[RESTART].status == "fault_killed"
    assert phases[RESTART].restored()[0]["step"] == 4 and phases[f"{RESTART}_2"].restored()[0]["step"] == 8
    assert max(phases[f"{RESTART}_2"].losses(0)) == 16
    assert result.verdict.kind.value == "RECOVERED", result.verdict.findings


@pytest.mark.parametrize("bug", [b for b in BUGS if b.catcher == "second_resume"], ids=lambda b: b.name)
def test_a_bug_only_a_second_resume_shows_passes_a_single_restart(tmp_path, bug):
    """The catcher that kills once at step 10 (the restart's saves are never restored) accepts it;
    `test_planted` shows second_resume catching it and accepting the correct twin."""
    catcher = next(c for c in CATCHERS if c.name == "kill_in_training")
    trial = run_trial(Harness(work_root=tmp_path), catcher, bug.strategy, bug.name)
    assert trial.judgement == "accepted", trial


SOAK = {"failures": 4, "every": [3, 5], "kinds": ["kill", "crash", "preempt"], "seed": 3}


def test_a_soak_draws_its_schedule_from_the_seed_into_a_plain_timeline():
    soak = {**BASE, "workload": {**BASE["workload"], "steps": 24, "checkpoint_every": 2}, "soak": SOAK}
    case = load_document(soak, "t.yaml").cases[0]
    again = load_document(soak, "t.yaml").cases[0]
    other = load_document({**soak, "soak": {**SOAK, "seed": 4}}, "t.yaml").cases[0]
    timeline = case.document["timeline"]
    assert timeline == again.document["timeline"] != other.document["timeline"] and "soak" not in case.document
    steps = [entry["fault"]["step"] for entry in timeline[:-1]]
    assert len(steps) == 4 and all(3 <= b - a <= 5 for a, b in zip([0, *steps], steps, strict=False))
    assert {entry["fault"]["kind"] for entry in timeline[:-1]} <= {"kill", "crash", "preempt"} and timeline[-1] == {}
    assert load_document(case.document, "t.yaml").cases[0].timeline == case.timeline  # replays as it is
    assert "soak.failures: with seed 3, failures every 3..5 steps reach step" in problem(
        soak={**SOAK, "failures": 5}, workload={**BASE["workload"], "steps": 12})
    assert "soak.kinds: must list fault kinds a soak draws from; got ['disk_full']" in problem(
        soak={**SOAK, "kinds": ["disk_full"]})
    assert "timeline: beside a soak" in problem(soak=SOAK, timeline=KILLS)


def test_a_soak_reports_its_schedule_the_steps_each_restore_lost_and_the_goodput(tmp_path):
    from resilience.report.launches import timeline_cost
    from resilience.report.text import render

    soak = {**BASE, "workload": {**BASE["workload"], "steps": 24, "checkpoint_every": 2}, "soak": SOAK}
    result = Harness(work_root=tmp_path).run(load_document(soak, "t.yaml").cases[0])
    assert result.verdict.kind.value == "RECOVERED", result.verdict.findings
    cost = timeline_cost(result)
    faults = [e["fault"]["step"] for e in result.case.document["timeline"][:-1]]
    assert [loss.restored_step for loss in cost.losses] == [(step - 1) // 2 * 2 for step in faults]
    assert all(loss.steps_lost == (step - 1) % 2 for loss, step in zip(cost.losses, faults, strict=True))
    assert cost.goodput is not None and 0 < cost.goodput < 1
    text = render(result)
    assert f"schedule: launch 1: {result.case.fault.kind} rank {result.case.fault.trigger.rank} at step {faults[0]}" \
        in text and "launch 5 (restart_4): restored step" in text and "goodput" in text


def test_torchrun_refuses_a_timeline_by_name():
    from resilience.launch.torchrun_command import incompatibility

    case = load_document({**BASE, "timeline": KILLS}, "t.yaml").cases[0]
    assert "a timeline of 3 launches, each with a fault of its own, runs under the local harness only" in \
        incompatibility(case)
    assert incompatibility(load_document({**BASE, "fault": KILLS[0]["fault"]}, "t.yaml").cases[0]) is None


def test_a_launch_at_another_size_is_judged_by_a_chain_of_continuations(tmp_path):
    """DCP at 2 ranks, then 4, then 2 again: the 4-rank restart is judged by a continuation of the
    reference's step-4 state at 4 ranks, and the third launch, which restores the restart's own
    step-8 save, by a continuation of that continuation's step-8 state at 2 ranks."""
    timeline = [KILLS[0], {"world_size": 4, "fault": {"kind": "kill", "rank": 3, "step": 10, "phase": "train"}}, {}]
    case = load_document({**BASE, "strategy": "dcp", "timeline": timeline}, "t.yaml").cases[0]
    assert case.keeps_snapshots and not case.computes_alike(0, 1) and case.computes_alike(0, 2)
    assert load_document(case.incarnation_document(1), "t.yaml").cases[0].workload.world_size == 4
    result = Harness(work_root=tmp_path).run(case)
    assert result.verdict.kind.value == "RECOVERED", result.verdict.findings
    phases = {p.name: p for p in result.phases}
    assert {"continuation", "continuation_2"} <= set(phases)
    assert phases["continuation"].world_size == 4 and phases["continuation_2"].world_size == 2
    assert phases[f"{RESTART}_2"].restored()[0]["step"] == 8 == phases["continuation_2"].restored()[0]["step"]
    # the trusted step-8 state is the 4-rank continuation's own, recorded for the launch after it
    assert any(e["event"] == "state" and e["step"] == 8 for e in phases["continuation"].ranks[0].events)
