"""Fault targets named by behaviour (`@written_by:R`, `@pointer`), resolved from the run's IO trace:
the catchers that used to look for the built-in schemes' file names apply to a strategy with a
layout of its own (`tests/other_layout_strategies.py`: `ckpt-8/shard-of-1.bin` and a `CURRENT`
pointer), accept its correct base and catch its bugs. Real ranks, real files."""
from __future__ import annotations

import pytest

from resilience.disk.io_trace import TraceOp
from resilience.disk.trace_targets import files_written, stale_text
from resilience.errors import ScenarioError
from resilience.planted.catalogue import catcher
from resilience.planted.trials import ACCEPTED, CAUGHT, run_trial
from resilience.run.harness import Harness

from .harness_helpers import case_from

LAYOUT = "tests.other_layout_strategies:"
# the catchers whose fault used to name files (or a version stamp only built-in schemes had)
BY_BEHAVIOUR = ("newer_version", "foreign_shard", "hostile_pickle", "stale_pointer")


def op(kind, path, step=8, target=""):
    return TraceOp(rank=1, seq=0, time_ns=0, step=step, kind=kind, path=path, target=target)


def test_the_files_a_rank_wrote_follow_renames_and_deletes():
    ops = [op("open", "ckpt-8/.shard-of-1.bin.partial"), op("rename", "ckpt-8/.shard-of-1.bin.partial",
                                                             target="ckpt-8/shard-of-1.bin"),
           op("open", "scratch"), op("unlink", "scratch"), op("open", "ckpt-4/x", step=4),
           op("rename", "", target="moved-in"), op("open", "$TMPDIR/staged")]
    assert files_written(ops, 8) == ["ckpt-8/shard-of-1.bin", "moved-in"]


def test_a_stale_pointer_says_what_it_said_one_save_earlier():
    assert stale_text("ckpt-8", 8, 4, {"ckpt-8"}, {"ckpt-4"}) == "ckpt-4"
    assert stale_text("step_00000008\n", 8, 4, set(), set()) == "step_00000004\n"
    assert stale_text("iteration 18", 8, 4, set(), set()) is None  # 18 is not step 8


@pytest.mark.parametrize("fault, key, allowed", [
    ({"kind": "bit_flip", "rank": 0, "step": 8, "file": "@written_by:2"}, "fault.file", "0..1"),
    ({"kind": "bit_flip", "rank": 0, "step": 8, "file": "@whatever"}, "fault.file", "@pointer"),
    ({"kind": "bit_flip", "rank": 0, "step": 8, "file": "@pointer"}, "fault.file", "@written_by:R"),
    ({"kind": "duplicate_file", "rank": 1, "step": 8, "file": "@written_by:1", "source": "@written_by:7"},
     "fault.source", "0..1"),
    ({"kind": "read_error", "rank": 0, "step": 8, "file": "@written_by:1"}, "fault.file", "a glob"),
])
def test_trace_targets_are_validated_with_file_key_value_and_what_is_allowed(fault, key, allowed):
    with pytest.raises(ScenarioError) as info:
        case_from(fault=fault)
    text = str(info.value)
    assert "tests/generated.scenario.yaml" in text and key in text and allowed in text
    assert repr(fault.get("source") if key == "fault.source" else fault["file"]) in text or fault["file"] in text


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return Harness(work_root=tmp_path_factory.mktemp("trace_targets"))


@pytest.mark.parametrize("name", BY_BEHAVIOUR)
def test_the_correct_base_of_another_layout_is_accepted_where_names_used_to_decide(harness, name):
    trial = run_trial(harness, catcher(name), LAYOUT + "OtherLayout", "other layout")
    assert trial.judgement == ACCEPTED, trial


@pytest.mark.parametrize("bug, name", [("IgnoresFormat", "newer_version"), ("AnyShardWillDo", "foreign_shard"),
                                       ("UnpicklesShards", "hostile_pickle"), ("TrustsCurrent", "stale_pointer")])
def test_bugs_of_another_layout_are_caught_by_behaviour(harness, bug, name):
    trial = run_trial(harness, catcher(name), LAYOUT + bug, bug)
    assert trial.judgement == CAUGHT and trial.verdict in ("SILENT", "RECOVERED"), trial


def test_a_strategy_without_a_pointer_is_told_why_the_pointer_catcher_does_not_apply(harness):
    trial = run_trial(harness, catcher("stale_pointer"), "torch.per_rank", "no pointer")
    assert trial.judgement == "not applicable", trial
    assert "@pointer: no pointer" in trial.evidence and "first reads at restore: rank 0" in trial.evidence, trial
