"""`resilience audit`: whole scenarios drawn by Hypothesis (derandomized CI profile), run in real
ranks, a failure shrunk within its own budget of runs and written as a replayable scenario file.
Bounded in runs: every audit here has a search and a shrink budget."""
from __future__ import annotations

import yaml

from resilience.commands.cli import main
from resilience.fuzz.audit import Draw, simpler
from resilience.planted.auditor import FAILS_CONTROL, Auditor
from resilience.planted.catalogue import CATCHERS
from resilience.run.harness import Harness
from resilience.scenario.loader import load_document

LAYOUT = "tests.other_layout_strategies:"
DROPS_NEWEST = LAYOUT + "KeepsThreeDropsOldest"


def checkpoints(workload: dict) -> list[int]:
    every = workload.get("checkpoint_every", 4)
    return list(range(every, workload["steps"] + 1, every))


def test_no_fixed_catcher_has_four_checkpoints_whose_step_numbers_gain_a_digit():
    # what the planted bug below needs: so the fixed catchers cannot catch it, whatever the fault
    for fixed in CATCHERS:
        steps = checkpoints(fixed.document["workload"])
        assert len(steps) < 4 or len({len(str(s)) for s in steps}) == 1, fixed.name


def test_shrinking_only_proposes_simpler_scenarios():
    start = Draw(world_size=4, steps=16, every=2, fault="truncate", rank=3, step=8, distinct_streams=True)
    proposed = list(simpler(start))
    assert proposed and all(p.size() < start.size() for p in proposed)
    assert all(p.rank < p.world_size for p in proposed)


def test_the_audit_finds_and_shrinks_a_bug_that_needs_four_checkpoints(tmp_path):
    harness = Harness(work_root=tmp_path)
    auditor = Auditor(harness, DROPS_NEWEST, report=print)
    found, shrink_runs = auditor.audit("ci", runs=8, shrink_runs=12)
    assert found is not None, auditor.runs
    assert len(auditor.runs) <= 8 + 12 and shrink_runs <= 12
    # the smallest: two ranks, no fault, step numbers that gain a digit at the fifth checkpoint
    assert (found.world_size, found.fault, found.steps, found.every) == (2, "none", 10, 2), found
    assert any(judgement == "accepted" for _, judgement in auditor.runs)  # simpler ones pass: it is the bug
    path = auditor.write(found, tmp_path / "out")
    replayed = harness.run(load_document(yaml.safe_load(path.read_text()), str(path)).cases[0])
    assert replayed.verdict.kind.value == "LOUD" and "ckpt-10" in replayed.verdict.first_error.message


def test_a_draw_the_correct_twin_fails_too_is_not_counted(tmp_path):
    # torch.per_rank keeps no checksums: a flipped bit loads as wrong state (SILENT), whoever saved it
    auditor = Auditor(Harness(work_root=tmp_path), "torch.per_rank", control="torch.per_rank", report=print)
    flipped = Draw(world_size=2, steps=8, every=4, fault="bit_flip", rank=1, step=8, distinct_streams=False)
    assert auditor.judge(flipped) == FAILS_CONTROL
    assert auditor.control_failures() == [flipped] and auditor.real_runs == 2


def test_planted_bugs_go_through_the_audit_and_the_correct_base_passes(tmp_path):
    harness = Harness(work_root=tmp_path)
    bugs = {LAYOUT + name: LAYOUT + "OtherLayout"
            for name in ("KeepsThreeDropsOldest", "TrustsCurrent", "UnpicklesShards")}
    bugs.update({"resilience.planted.state_bugs:" + name: "torch.per_rank"
                 for name in ("ForgetsOptimizer", "LoadsOldest")})
    caught = []
    for bug, control in bugs.items():
        found, _ = Auditor(harness, bug, control=control, report=print).audit("ci", runs=3, shrink_runs=0)
        if found is not None:
            caught.append(bug)
    print(f"audit, 3 runs each: caught/planted = {len(caught)}/{len(bugs)}: {caught}")
    assert {DROPS_NEWEST, "resilience.planted.state_bugs:ForgetsOptimizer",
            "resilience.planted.state_bugs:LoadsOldest"} <= set(caught)
    base = Auditor(harness, LAYOUT + "OtherLayout", report=print)
    assert base.audit("ci", runs=3, shrink_runs=0)[0] is None, base.runs  # no false alarm
    assert len(base.runs) == 3


def test_cli_prints_the_replay_command(tmp_path, capsys):
    assert main(["audit", "--workdir", str(tmp_path / "work"), "--strategy", LAYOUT + "OtherLayout", "--runs", "1",
                 "--out", str(tmp_path / "out")]) == 0
    assert "no failing scenario in 1 runs" in capsys.readouterr().out
