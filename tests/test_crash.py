"""The crash fault: a real SIGSEGV and SIGABRT from C, os._exit, and an exception raised in DCP
async_save's background writer thread, through the real harness."""
from __future__ import annotations

import pytest

from resilience.core.case import VerdictKind
from resilience.scenario.loader import load_document

from .harness_helpers import run_case

CRASH = {"kind": "crash", "rank": 1, "step": 8, "phase": "save", "point": "write", "file": "*_rank_1.pt",
         "after_bytes": 4096}


def _fired(result):
    return next(e for p in result.phases for e in p.fault_events if e["event"] == "fault_fired")


def test_a_segfault_in_native_code_dumps_every_thread_and_the_torn_file_is_refused(tmp_path):
    result = run_case(tmp_path, fault={**CRASH, "how": "segfault"}, workload={"steps": 12},
                      timeouts={"collective": 20, "phase": 60})
    first_run = result.phase("first_run")
    assert first_run.ranks[1].returncode == -11  # SIGSEGV, not a Python exception
    assert "Fatal Python error: Segmentation fault" in first_run.ranks[1].stderr_tail
    assert result.verdict.kind is VerdictKind.LOUD and "central directory" in result.verdict.first_error.message
    note = next(f for f in result.verdict.findings if f.startswith("crash (segfault) of rank 1"))
    assert "killed by SIGSEGV" in note and "Current thread" in note and "save" in note, note


def test_abort_and_os_exit_end_the_rank_without_a_python_error(tmp_path):
    # torch.rank0: rank 1 writes no file; rank 0 completes step 8's before it fails at the barrier
    aborted = run_case(tmp_path, strategy="torch.rank0", workload={"steps": 12},
                       fault={"kind": "crash", "how": "abort", "rank": 1, "step": 8, "phase": "save"},
                       timeouts={"collective": 20, "phase": 60})
    assert aborted.phase("first_run").ranks[1].returncode == -6  # SIGABRT
    assert aborted.phase("first_run").status == "fault_killed"  # the peer's error is a consequence
    assert aborted.verdict.kind is VerdictKind.RECOVERED and aborted.verdict.restored_step == 8
    exited = run_case(tmp_path, fault={"kind": "crash", "how": "os_exit", "rank": 0, "step": 6, "phase": "train"},
                      timeouts={"collective": 20, "phase": 60})
    assert exited.phase("first_run").ranks[0].returncode == 1
    assert not [e for e in exited.phase("first_run").ranks[0].events if e["event"] == "error"]
    assert exited.verdict.kind is VerdictKind.RECOVERED and exited.verdict.restored_step == 4


@pytest.mark.slow
def test_an_exception_in_the_async_writer_thread_reaches_the_job_at_the_next_save(tmp_path):
    result = run_case(tmp_path, strategy={"name": "dcp", "options": {"mode": "async"}}, workload={"steps": 12},
                      fault={**CRASH, "how": "thread_exception", "file": "step_00000008/__1_0.distcp"},
                      expect={"outcome": "fails_loudly", "fallback_ok": True},
                      timeouts={"collective": 20, "phase": 60})
    fired = _fired(result)
    assert not fired["main_thread"] and fired["phase"] != "save"  # the rank had moved on when it fired
    assert result.verdict.kind is VerdictKind.LOUD
    assert "CheckpointException" in result.verdict.first_error.summary()
    assert "InjectedCrash" in result.verdict.first_error.summary() + result.verdict.first_error.traceback


def test_an_exception_in_a_thread_needs_a_file_point():
    document = {"name": "x", "strategy": "torch.per_rank", "expect": "recovers",
                "workload": {"model": "mlp", "world_size": 2, "steps": 8, "checkpoint_every": 4},
                "fault": {"kind": "crash", "how": "thread_exception", "rank": 0, "step": 4}}
    with pytest.raises(Exception, match=r"fault.point.*a file point.*allowed: open, write, fsync, close"):
        load_document(document, "tests/generated.scenario.yaml")
