"""Each phase's ranks work in a directory of their own, and a restoring rank reports what it opens
under the first run's phase directory (`resilience.rank.working_dir`): the checkpoint must be all a
restart needs."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from resilience.core.case import VerdictKind
from resilience.strategies.torch.native import CHECK_LOSS_KEY, STAMP_KEY, PerRankSave

from .harness_helpers import run_case

KILL = {"kind": "kill", "rank": 1, "step": 6, "phase": "train"}


class ScheduleInWorkingDir(PerRankSave):
    """Keeps the LR schedule in a file named relative to the working directory, as a script that
    writes ``schedule.pt`` beside itself does."""

    def file_content(self, workload):
        content = super().file_content(workload)
        torch.save(content.pop("scheduler"), f"schedule_rank_{self.context.rank}.pt")
        return content

    def restore_from(self, path, workload):
        state = {key: value for key, value in torch.load(path, weights_only=True).items()
                 if key not in (STAMP_KEY, CHECK_LOSS_KEY)}
        state["scheduler"] = torch.load(f"schedule_rank_{self.context.rank}.pt", weights_only=True)
        workload.load_state_dict(state)


def test_the_hook_reports_opens_and_listings_under_the_roots_once_each(tmp_path):
    first_run, elsewhere = tmp_path / "first_run", tmp_path / "elsewhere"
    for directory in (first_run / "work", elsewhere):
        directory.mkdir(parents=True)
    (first_run / "work" / "config.json").write_text("{}")
    (elsewhere / "other.json").write_text("{}")
    script = textwrap.dedent(f"""
        import json, os, sys
        from pathlib import Path
        from resilience.rank.working_dir import enter_working_dir, watch_foreign_reads
        found = []
        work = enter_working_dir(Path({str(tmp_path / "restart")!r}))
        watch_foreign_reads(({str(first_run)!r},), lambda event, **fields: found.append(fields))
        for _ in range(2):
            open({str(first_run / "work" / "config.json")!r}).read()
        os.listdir({str(first_run)!r})
        open({str(elsewhere / "other.json")!r}).read()
        open("here.txt", "w").write("x")
        print(json.dumps({{"found": found, "cwd": os.getcwd(), "work": str(work)}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["cwd"] == result["work"] == str(tmp_path / "restart" / "work")
    assert (tmp_path / "restart" / "work" / "here.txt").exists()
    assert result["found"] == [{"path": str(first_run / "work" / "config.json"), "how": "open"},
                               {"path": str(first_run), "how": "os.listdir"}]


def test_a_file_kept_in_the_working_directory_is_out_of_reach_of_the_restart(tmp_path):
    """The restart's working directory is its own: the relative path the first run wrote is not
    there, and the restore fails loudly instead of reading the first run's file."""
    result = run_case(tmp_path, strategy=f"{__name__}:ScheduleInWorkingDir", fault=KILL)
    assert result.verdict.kind == VerdictKind.LOUD, result.verdict.findings
    assert "schedule_rank_" in result.verdict.first_error.message, result.verdict.first_error


def test_a_file_read_back_by_absolute_path_from_the_first_runs_directory_is_a_finding(tmp_path):
    result = run_case(tmp_path, strategy="resilience.planted.state_bugs:KeepsScheduleBesideCheckpoint", fault=KILL)
    assert result.verdict.kind == VerdictKind.SILENT
    found = [line for line in result.verdict.findings if "outside the checkpoint directory" in line]
    assert len(found) == 2 and "first_run/work/schedule_rank_0.pt" in found[0], result.verdict.findings
    twin = run_case(tmp_path / "twin", fault=KILL)
    assert twin.verdict.kind == VerdictKind.RECOVERED
    assert not any("outside the checkpoint directory" in line for line in twin.verdict.findings)
