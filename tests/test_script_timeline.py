"""A timeline on a user's script (black-box mode): the job relaunched once per entry with its own
arguments and fault, each launch judged from the step it restored against the uninterrupted run,
with every earlier launch's saves as its history (`run.script_timeline`, `oracle.blackbox_timeline`)."""
from __future__ import annotations

from pathlib import Path

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import ScenarioError
from resilience.oracle.blackbox import RankLog
from resilience.oracle.blackbox_timeline import judge_timeline, merged

GPT_TRAINER = Path(__file__).resolve().parent.parent / "examples" / "scripts" / "gpt_trainer.py"
RESUME = '[--out-dir, "{checkpoint_dir}", --init-from, resume]'
STALE = '[--out-dir, "{checkpoint_dir}", --init-from, resume, --stale-rng-after-resume]'


def scenario(tmp_path: Path, body: str, restart_args: str = RESUME) -> Path:
    path = tmp_path / "t.scenario.yaml"
    path.write_text(f"name: t\nscript:\n  path: {GPT_TRAINER}\n  args: [--out-dir, \"{{checkpoint_dir}}\"]\n"
                    f"  restart_args: {restart_args}\n  nproc_per_node: 2\n{body}expect: recovers\n"
                    "timeouts: {phase: 240}\n")
    return path


TIMELINE = """timeline:
  - fault: {kind: kill, rank: 1, step: 6, phase: train}
  - fault: {kind: kill, rank: 0, step: 5, phase: train}
  - {}
"""


@pytest.mark.parametrize("body, key, problem", [
    ("fault: {kind: kill, rank: 1, step: 6}\n" + TIMELINE, "fault", "beside a timeline"),
    ("timeline:\n  - {fault: {kind: kill, rank: 1, step: 6}}\n"
     "  - {fault: {kind: truncate, rank: 0, step: 4, file: ckpt.pt}}\n  - {}\n", "timeline.1.fault.kind",
     "cannot be armed in a later launch"),
    ("timeline:\n  - {fault: {kind: kill, rank: 1, step: 6}}\n  - {fault: {kind: kill, rank: 0, step: 2}}\n",
     "timeline.1.fault", "the last launch runs the job to its end"),
    ("timeline:\n  - {fault: {kind: kill, rank: 5, step: 6}}\n  - {}\n", "timeline.0.fault.rank", "out of range"),
    ("timeline:\n  - {args: [--x]}\n  - {}\n", "timeline.0.args", "unknown key"),
    ("timeline:\n  - {}\n", "timeline", "must list 2 to"),
])
def test_a_bad_script_timeline_names_the_key(tmp_path, body, key, problem):
    from resilience.scenario.loader import load_any_file

    with pytest.raises(ScenarioError) as caught:
        load_any_file(scenario(tmp_path, body))
    assert caught.value.key == key and problem in str(caught.value), str(caught.value)


def test_a_script_timeline_refuses_a_restart_at_another_size(tmp_path):
    from resilience.scenario.loader import load_any_file

    path = scenario(tmp_path, TIMELINE)
    path.write_text(path.read_text().replace("  nproc_per_node: 2\n",
                                             "  nproc_per_node: 2\n  restart_nproc_per_node: 1\n"))
    with pytest.raises(ScenarioError, match=r"script\.restart_nproc_per_node.*every launch of a script's timeline"):
        load_any_file(path)


def test_later_launches_take_the_restart_args_unless_they_give_their_own(tmp_path):
    from resilience.scenario.loader import load_any_file

    body = TIMELINE.replace("  - {}\n", "  - {args: [--out-dir, \"{checkpoint_dir}\", --init-from, auto]}\n")
    (case,) = load_any_file(scenario(tmp_path, body))
    assert case.fault.kind == "kill" and case.fault.trigger.rank == 1
    assert [launch.fault.kind for launch in case.timeline] == ["kill", "none"]
    assert case.timeline[0].args[-2:] == ("--init-from", "resume")
    assert case.timeline[1].args[-2:] == ("--init-from", "auto")


def hook_log(rank: int, losses: dict[int, float], states: dict[int, str], saved=(), fault=False) -> RankLog:
    """A rank seen by the hooks only: per hook step its loss and the parameters before it."""
    digests = {step: {"parameters": states[step], "optimizer": "o" + states[step]} for step in losses}
    after = {step: {"parameters": states[step + 1], "optimizer": "o" + states[step + 1]} for step in losses
             if step + 1 in states}
    return RankLog(rank=rank, losses={}, saved=tuple(saved), restored=(), errors=(),
                   fault_events=({"event": "fault_fired", "ends_process": True, "time": 1.0},) if fault else (),
                   observed=losses, digests=digests, after=after)


def test_a_later_launch_is_judged_from_the_job_s_steps_with_every_earlier_save_as_its_history():
    states = {step: f"p{step}" for step in range(1, 8)}
    reference = [hook_log(r, {s: s / 10 for s in range(1, 7)}, states, saved=(2, 4, 6)) for r in (0, 1)]
    first = [hook_log(r, {1: 0.1, 2: 0.2, 3: 0.3}, states, saved=(2,), fault=True) for r in (0, 1)]
    # from step 2: its own steps 1, 2 are the job's 3, 4; it saved step 4 and was killed in step 5
    second = [hook_log(r, {1: 0.3, 2: 0.4, 3: 0.5}, {1: "p3", 2: "p4", 3: "p5", 4: "p6"}, saved=(2,), fault=True)
              for r in (0, 1)]
    third = [hook_log(r, {1: 0.5, 2: 0.6}, {1: "p5", 2: "p6", 3: "p7"}) for r in (0, 1)]
    verdict = judge_timeline(reference, [first, second, third], None)
    assert verdict.kind == VerdictKind.RECOVERED, verdict.findings
    assert "launch 2 restored step 2 (newest complete 2): RECOVERED" in verdict.findings
    assert "launch 3 restored step 4 (newest complete 4): RECOVERED" in verdict.findings
    history = merged([first, [log.shifted(2) for log in second]])
    assert history[0].saved == (2, 4) and sorted(history[0].observed) == [1, 2, 3, 4, 5]
    # the same third launch that restored step 2 again, though step 4 was complete: SILENT, named
    stale = [hook_log(r, {1: 0.3, 2: 0.4, 3: 0.5, 4: 0.6}, {1: "p3", 2: "p4", 3: "p5", 4: "p6", 5: "p7"})
             for r in (0, 1)]
    verdict = judge_timeline(reference, [first, second, stale], None)
    assert verdict.kind == VerdictKind.SILENT and verdict.restored_step == 2, verdict.findings
    lost = "launch 3: lost checkpoint: restored step 2, but the step-4 save"
    assert any(line.startswith(lost) for line in verdict.findings), "\n".join(verdict.findings)


@pytest.mark.slow
@pytest.mark.minutes(1.5)
def test_a_bug_only_a_second_resume_shows_passes_one_restart_and_is_caught_by_the_timeline(tmp_path):
    """gpt_trainer --stale-rng-after-resume saves the RNG states it loaded: the first resume is
    exact, so one restart accepts it; the third launch restores step 8 with step 4's streams."""
    from resilience.run.blackbox import run_script_case
    from resilience.scenario.loader import load_any_file

    from .harness_helpers import shared_reference_cache

    cache = shared_reference_cache()
    one = scenario(tmp_path, "fault: {kind: kill, rank: 1, step: 6, phase: train}\n", STALE)
    (case,) = load_any_file(one)
    single = run_script_case(case, work_root=tmp_path, cache=cache)
    assert single.verdict.kind == VerdictKind.RECOVERED and single.verdict.restored_step == 4, single.verdict.findings
    (case,) = load_any_file(scenario(tmp_path, TIMELINE, STALE))
    caught = run_script_case(case, work_root=tmp_path, cache=cache)
    assert caught.verdict.kind == VerdictKind.SILENT and caught.verdict.restored_step == 8, caught.verdict.findings
    stale = ("launch 3: rank 0: parameters restored at step 8; not restored: torch's RNG stream "
             "(it is the one of step 4)")
    assert stale in caught.verdict.findings, caught.verdict.findings
    assert "launch 2 restored step 4 (newest complete 4): RECOVERED" in caught.verdict.findings
    assert len(caught.later) == 1 and {e["step"] for log in caught.restart for e in log.fault_events} == {5}
    (case,) = load_any_file(scenario(tmp_path, TIMELINE))
    correct = run_script_case(case, work_root=tmp_path, cache=cache)
    assert correct.verdict.kind == VerdictKind.RECOVERED, correct.verdict.findings
    assert "launch 3 restored step 8 (newest complete 8): RECOVERED" in correct.verdict.findings
    assert list(tmp_path.glob("resilience-blackbox-*")) == []
