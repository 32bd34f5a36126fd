"""A failure the job reports only in its log: the job ends, every rank exiting 0, and its last save
is lost. An error-level record in a rank's log (logging's ERROR or CRITICAL, an uncaught traceback)
makes that LOUD; a warning that goes on, or nothing at all, leaves it SILENT."""
from __future__ import annotations

import pytest

from resilience.core.case import VerdictKind
from resilience.core.records import PhaseResult, RankRecord
from resilience.oracle.rules import logged_error

from .harness_helpers import run_case

# an exception in the thread writing rank 1's first file of the step-12 save, the job's last
LAST_SAVE_WRITER_FAILS = {
    "workload": {"model": "mlp", "world_size": 2, "steps": 12, "checkpoint_every": 4, "seed": 0},
    "fault": {"kind": "crash", "how": "thread_exception", "rank": 1, "step": 12, "point": "write", "file": "*",
              "after_bytes": 4096},
    "timeouts": {"collective": 20, "phase": 60},
    "expect": "fails_loudly",
}


def phase_with(*stderr: str) -> PhaseResult:
    ranks = tuple(RankRecord(rank, 0, (), "", text) for rank, text in enumerate(stderr))
    return PhaseResult("first_run", len(stderr), "completed", ranks, None, (), 1.0)


@pytest.mark.parametrize("stderr, found", [
    ("ERROR:checkpoint:background checkpoint of step 12 failed: OSError()", "ERROR:checkpoint:background"),
    ("2026-12-05 10:00:00 - ckpt - CRITICAL - save lost", "CRITICAL - save lost"),
    ("[ERROR] writer died", "[ERROR] writer died"),
    ("Exception in thread Thread-3 (write):\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
     "OSError: [Errno 5] Input/output error", "OSError: [Errno 5] Input/output error"),
])
def test_error_level_records_are_found(stderr, found):
    error = logged_error(phase_with("", stderr))
    assert error is not None and error.rank == 1 and found in error.message, error


@pytest.mark.parametrize("stderr", [
    "warning: background checkpoint of step 12 failed, continuing: OSError()",
    "UserWarning: TypedStorage is deprecated",
    "no errors here; ERRORS_SEEN=0 and terror are not records",
])
def test_warnings_and_plain_words_are_not_errors(stderr):
    assert logged_error(phase_with(stderr, "")) is None


@pytest.mark.slow
def test_a_lost_last_save_is_loud_only_where_the_log_says_so(tmp_path):
    swallowed = run_case(tmp_path, strategy="resilience.planted.async_bugs:SwallowsWriterError",
                         **LAST_SAVE_WRITER_FAILS)
    assert swallowed.verdict.kind is VerdictKind.SILENT, swallowed.verdict.findings
    assert any("believing step 12 saved" in line for line in swallowed.verdict.findings)

    logged = run_case(tmp_path, strategy="tests.strategies_under_test:LogsWriterError", **LAST_SAVE_WRITER_FAILS)
    assert logged.verdict.kind is VerdictKind.LOUD, logged.verdict.findings
    assert logged.verdict.first_error.type == "LoggedError"  # DCP's failed write reaches every rank's future
    assert "background checkpoint of step 12 failed" in logged.verdict.first_error.message
    assert any("log said it failed" in line for line in logged.verdict.findings), logged.verdict.findings
