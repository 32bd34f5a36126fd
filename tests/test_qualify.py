"""`resilience qualify`: real cases in real ranks -> HTML, JSON and JUnit, opened in headless Chromium."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from resilience.commands import cli
from resilience.commands.qualify_cases import keyword_filter
from resilience.errors import ResilienceError
from resilience.measure.environment import mount_of, parse_mountinfo
from resilience.scenario.loader import load_document

from .headless_chromium import Browser, find_chromium

ROOT = Path(__file__).resolve().parent.parent
BROKEN = {
    "name": "a strategy that forgets the optimizer",
    "description": "restores everything but the Adam moments: the checker must call it SILENT",
    "strategy": "tests.strategies_under_test:ForgetsOptimizer",
    "workload": {"model": "mlp", "world_size": 2, "steps": 8, "checkpoint_every": 4, "seed": 0},
    "fault": {"kind": "kill", "rank": 1, "step": 6, "phase": "train"},
    "expect": "recovers",
}
# LOUD, yet the step-4 checkpoint is intact: rank 1 aborts before its step-8 file, the restore
# follows the newest step directory into the missing file and never tries step 4
REFUSED = {
    "name": "per-rank restore refuses a step with a missing file",
    "strategy": "torch.per_rank",
    "workload": {"model": "mlp", "world_size": 2, "steps": 12, "checkpoint_every": 4, "seed": 0},
    "fault": {"kind": "crash", "how": "abort", "rank": 1, "step": 8, "phase": "save"},
    "expect": "fails_loudly",
    "timeouts": {"collective": 20, "phase": 60},
}


@pytest.fixture(scope="module")
def qualified(tmp_path_factory):
    """One qualification run: a passing shipped case, a failing broken strategy, small throughput figures."""
    root = tmp_path_factory.mktemp("qualify")
    scenario = root / "broken.scenario.yaml"
    scenario.write_text(yaml.safe_dump(BROKEN))
    refused = root / "refused.scenario.yaml"
    refused.write_text(yaml.safe_dump(REFUSED))
    out = root / "report"
    status = cli.main(["qualify", str(ROOT / "scenarios" / "no_fault.scenario.yaml"), str(scenario), str(refused),
                       "-k", "per_rank or forgets", "--out", str(out), "--workdir", str(root / "work"),
                       "--no-cache", "--probe-size", "8MiB", "--throughput-size", "1MiB",
                       "--throughput-world-size", "2"])
    return status, out, json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_exit_status_is_nonzero_when_a_case_fails(qualified):
    status, _, report = qualified
    assert status == 1
    by_status = [c["status"] for c in report["cases"]]
    assert sorted(by_status) == ["failed", "passed", "passed"], by_status
    assert report["summary"] == {"total": 3, "passed": 2, "failed": 1}


@pytest.mark.slow
def test_json_carries_losses_steps_lost_and_restore_time(qualified):
    _, _, report = qualified
    passed = next(c for c in report["cases"] if c["status"] == "passed" and c["verdict"] == "RECOVERED")
    failed = next(c for c in report["cases"] if c["status"] == "failed")
    assert passed["verdict"] == "RECOVERED" and passed["steps_lost"] == 0 and passed["restored_step"] == 12
    assert len(passed["reference_losses"]) == 12 and passed["restore_s"] > 0
    assert failed["verdict"] == "SILENT"
    # killed at the start of step 6, restored step 4: step 5 was trained and is lost
    assert failed["restored_step"] == 4 and failed["steps_lost"] == 1
    restored = dict(map(tuple, failed["restored_losses"]))
    reference = dict(map(tuple, failed["reference_losses"]))
    assert restored[6] != reference[6]  # the cold optimizer shows from step 6 on
    assert any(log["stderr_tail"] or log["stdout_tail"] for log in failed["logs"]) or failed["logs"]
    assert "python -m resilience run" in failed["replay"]
    # lost work: the restart's start-up and load, then the replay of step 5
    assert passed["lost_s"] == passed["restart_s"] + passed["replay_s"] and passed["replay_s"] == 0
    assert failed["restart_s"] > 0 and failed["replay_s"] > 0 and failed["lost_s"] > failed["restart_s"]
    by_strategy = {row["strategy"]: row for row in report["lost_work"]}
    broken = by_strategy["tests.strategies_under_test:ForgetsOptimizer"]
    assert broken["steps_lost"] == 1 and broken["lost_s"] == pytest.approx(failed["lost_s"])
    assert broken["restore_s"] == pytest.approx(failed["restore_s"])


@pytest.mark.slow
def test_a_refused_restore_beside_an_intact_checkpoint_is_reported(qualified):
    _, _, report = qualified
    refused = next(c for c in report["cases"] if c["verdict"] == "LOUD")
    assert refused["status"] == "passed" and refused["intact_step"] == 4 and refused["restored_step"] is None
    assert any(f.startswith("refused; step 4 was intact and never tried") for f in refused["findings"])
    assert refused["lost_s"] is None and refused["steps_lost"] is None  # nothing restored: the job is down
    per_rank = {row["strategy"]: row for row in report["lost_work"]}["torch.per_rank"]
    assert per_rank["cases"] == 2 and per_rank["restored"] == 1 and per_rank["refused_with_intact"] == 1


@pytest.mark.slow
def test_json_records_environment_and_filesystem_figures(qualified):
    _, _, report = qualified
    env = report["environment"]
    assert env["libraries"]["torch"] and env["python"] and env["kernel"].startswith("Linux")
    assert env["mount"]["fs_type"] and env["mount"]["options"]
    assert report["bandwidth"]["bytes_per_s"] > 0
    labels = [t["strategy"] for t in report["throughput"]]
    assert labels == ["torch.per_rank", "torch.per_rank {stagger: 1}"]
    # a strategy that does not restore its own no-fault checkpoint gets no figure, and the report says why
    assert any("ForgetsOptimizer not measured" in note and "SILENT" in note for note in report["notes"])
    for figure in report["throughput"]:
        assert figure["bytes_per_checkpoint"] > 1 << 20
        assert figure["save_fraction"] > 0 and figure["restore_fraction"] > 0


@pytest.mark.slow
def test_junit_lists_every_case_with_its_failure(qualified):
    _, out, _ = qualified
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("tests") == "3" and suite.get("failures") == "1"
    failures = [case for case in suite.iter("testcase") if case.find("failure") is not None]
    assert len(failures) == 1 and "SILENT" in failures[0].find("failure").text


@pytest.mark.slow
def test_html_renders_in_headless_chromium(qualified):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    _, out, _ = qualified
    with Browser(chromium) as browser:
        browser.open((out / "report.html").as_uri())
        assert browser.errors() == []
        assert browser.evaluate("document.getElementById('overall').textContent") == "FAILED"
        header = browser.evaluate("Array.from(document.querySelectorAll('#verdict-matrix th'))"
                                  ".map(e => e.textContent)")
        assert {"none", "kill", "crash", "torch.per_rank",
                "tests.strategies_under_test:ForgetsOptimizer"} <= set(header)
        cells = browser.evaluate("Array.from(document.querySelectorAll('#verdict-matrix td a'))"
                                 ".map(a => a.textContent)")
        assert sorted(cells) == ["LOUD ⚠", "RECOVERED", "SILENT ✗"]
        mark = browser.evaluate("document.querySelector('#verdict-matrix .intact').getAttribute('title')")
        assert mark == "refused; step 4 was intact and never tried"
        lost = browser.evaluate("Array.from(document.querySelectorAll('#lost-work tr')).map(r => "
                                "Array.from(r.children).map(c => c.textContent))")
        assert lost[0][:4] == ["strategy", "cases", "restored", "steps lost"] and len(lost) == 3
        assert {row[0]: row[3] for row in lost[1:]} == {"torch.per_rank": "0",
                                                         "tests.strategies_under_test:ForgetsOptimizer": "1"}
        assert browser.evaluate("document.querySelectorAll('td.lost-work').length") == 3
        # every loss curve and the throughput bars are laid out with a real size: reference and
        # first run of the no-fault case (restored at its last step), all three of the broken one,
        # reference and first run of the refused one (nothing restored)
        widths = browser.evaluate("Array.from(document.querySelectorAll("
                                  "'svg.plot polyline.series, #throughput-plot rect')).map(e => e.getBBox().width)")
        assert len(widths) == 2 + 3 + 2 + 2 * 2 and all(w > 0 for w in widths), widths
        assert browser.evaluate("document.querySelectorAll('section.case').length") == 3
        assert browser.evaluate("document.querySelectorAll('details.rank-log').length") >= 1
        assert browser.evaluate("document.querySelectorAll('code.replay').length") == 3


def test_browser_check_sees_a_page_error(tmp_path):
    """The renderer check can fail: a page with a script error and a missing resource is caught."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    page = tmp_path / "broken.html"
    page.write_text("<html><body><img src='missing.png'><script>undefined_function()</script></body></html>")
    with Browser(chromium) as browser:
        browser.open(page.as_uri())
        errors = browser.errors()
    assert any("undefined_function" in e or "Uncaught" in e for e in errors), errors
    assert any("missing.png" in e for e in errors), errors


def test_keyword_selection_uses_pytest_expressions():
    case = load_document({**BROKEN, "strategy": "torch.rank0"}, "scenarios/x.scenario.yaml").cases[0]
    assert keyword_filter("rank0 and kill")(case)
    assert not keyword_filter("rank0 and not kill")(case)
    assert keyword_filter(None)(case)
    with pytest.raises(ResilienceError, match=r"-k 'rank0 and': .*allowed: words joined by and"):
        keyword_filter("rank0 and")(case)


def test_keyword_selection_matches_a_case_by_its_values():
    case = load_document({**BROKEN, "strategy": "torch.rank0", "matrix": {"fault.step": [6, 7]}},
                         "scenarios/x.scenario.yaml").cases[1]
    assert keyword_filter("case(strategy='torch.rank0', fault='kill', fault_step=7)")(case)
    assert not keyword_filter("case(fault_step=6)")(case)
    assert not keyword_filter("case(fault_step='7')")(case)  # whole numbers are ints, as pytest's -m has them
    assert not keyword_filter("case(no_such_key=7)")(case)
    assert keyword_filter("kill and not case(fault_step=6)")(case)
    with pytest.raises(ResilienceError, match=r"-k 'strategy\(name=1\)': strategy\(...\) names nothing; allowed: case"):
        keyword_filter("strategy(name=1)")


def test_malformed_keyword_expression_is_refused(tmp_path, capsys):
    status = cli.main(["qualify", str(ROOT / "scenarios"), "-k", "rank0 and", "--out", str(tmp_path)])
    assert status == 2 and "-k 'rank0 and'" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_launcher_runs_through_the_elastic_restart_and_skips_what_it_cannot_express(tmp_path):
    """A kill recovers through torchrun's own restart; a restart at another world size cannot be one
    torchrun job, so it is reported as skipped with the reason, never run some other way."""
    cli.main(["qualify", str(ROOT / "scenarios" / "kill_between_files.scenario.yaml"),
              str(ROOT / "scenarios" / "world_size_change.scenario.yaml"), "-k", "rank0",
              "--out", str(tmp_path), "--launcher", "torchrun", "--no-throughput", "--workdir", str(tmp_path)])
    cases = {c["source"].rsplit("/", 1)[-1]: c for c in json.loads((tmp_path / "report.json").read_text())["cases"]}
    assert cases["kill_between_files.scenario.yaml"]["status"] == "passed"
    assert cases["kill_between_files.scenario.yaml"]["verdict"] == "RECOVERED"
    skipped = cases["world_size_change.scenario.yaml"]
    assert skipped["status"] == "skipped" and "not run under torchrun" in skipped["reason"]


def test_mount_of_picks_the_innermost_mount():
    text = ("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "40 22 0:40 / /mnt/ckpt rw,nosuid - tmpfs tmpfs rw,size=1024k\n"
            "41 22 0:41 / /mnt/ck\\040pt rw - nfs server:/x rw,vers=4.2\n")
    assert [m.fs_type for m in parse_mountinfo(text)] == ["ext4", "tmpfs", "nfs"]
    assert mount_of(Path("/mnt/ckpt/run1"), text).fs_type == "tmpfs"
    assert mount_of(Path("/mnt/ck pt"), text).fs_type == "nfs"
    assert mount_of(Path("/mnt/ckptx"), text).fs_type == "ext4"


def test_a_script_scenario_is_qualified_beside_the_strategies(tmp_path, capsys):
    """A case on a user's script (preempted, restarted by torchrun) and a pinned one in the same
    report: verdicts, the script as the matrix row, the restart's losses at their real steps."""
    script = ROOT / "examples" / "scripts" / "gpt_trainer.py"
    (tmp_path / "gpt.scenario.yaml").write_text(yaml.safe_dump({
        "name": "gpt trainer", "script": {"path": str(script), "args": ["--out-dir", "{checkpoint_dir}"],
                                          "restart_args": ["--out-dir", "{checkpoint_dir}", "--init-from", "resume"]},
        "fault": {"kind": "preempt", "rank": 1, "step": 6, "phase": "train", "grace": 5}, "expect": "recovers",
        "matrix": [{"fault.kind": "preempt"},
                   {"fault": {"kind": "truncate", "rank": 0, "step": 8, "file": "ckpt.pt"},
                    "expect": "fails_loudly"}]}))
    out = tmp_path / "report"
    code = cli.main(["qualify", str(tmp_path), "--out", str(out), "--no-throughput", "--cache", str(tmp_path / "c")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((out / "report.json").read_text())
    preempted, truncated = sorted(report["cases"], key=lambda case: case["fault"])
    assert (preempted["verdict"], truncated["verdict"]) == ("RECOVERED", "LOUD"), printed
    assert preempted["strategy"] == "script gpt_trainer.py --out-dir '{checkpoint_dir}'"
    assert preempted["restored_step"] == 4 and preempted["steps_lost"] == max(
        step for step, _ in preempted["first_run_losses"]) - 4
    restored = dict(preempted["restored_losses"])
    assert min(restored) == 5 and restored == {step: loss for step, loss in preempted["reference_losses"] if step > 4}
    assert preempted["replay"].startswith("python -m pytest ") and "::" in preempted["replay"]
    assert report["lost_work"][0]["restart_s"] is None  # a script's restart is torchrun's: not timed
    assert "gpt_trainer.py" in (out / "report.html").read_text()
