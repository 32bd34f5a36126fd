"""The collective_failure fault, and why it fails the transport rather than calling abort()."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from resilience.core.case import VerdictKind

from .harness_helpers import run_case

ABORT_PROBE = textwrap.dedent('''
    import datetime, os, sys, torch, torch.distributed as dist
    rank, store_path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 1:
        dist.distributed_c10d._get_default_group().abort()
    dist.all_reduce(t)
    print("second all_reduce", t.item(), flush=True)
    # what is measured ends here: rank 0's group destructor at interpreter exit, its peer gone,
    # once hit std::terminate ("terminate called without an active exception", SIGABRT) under -n 2
    os._exit(0)
''')


def test_process_group_abort_does_nothing_on_gloo(tmp_path):
    """pytorch/pytorch#130345: on gloo, abort() returns and the next all-reduce succeeds on both ranks."""
    script = tmp_path / "abort_probe.py"
    script.write_text(ABORT_PROBE)
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outputs = []
    for process in ranks:
        try:
            out, err = process.communicate(timeout=120)
        finally:
            process.kill()
        outputs.append((process.returncode, out, err))
    assert all(code == 0 and "second all_reduce 4.0" in out for code, out, _ in outputs), outputs


def test_a_shut_down_transport_fails_both_ranks_collectives(tmp_path):
    result = run_case(tmp_path, fault={"kind": "collective_failure", "how": "transport", "rank": 1, "step": 6,
                                       "phase": "train"}, expect="fails_loudly",
                      timeouts={"collective": 10, "phase": 60})
    fired = next(e for e in result.phase("first_run").fault_events)
    assert fired["sockets"] >= 1  # gloo's pairs, found through /proc
    assert result.verdict.kind is VerdictKind.LOUD and result.verdict.restored_step == 4
    # gloo's own error on a closed connection, not an exception the fault raised
    assert result.verdict.first_error.type == "RuntimeError"
    assert "gloo/transport/tcp" in result.verdict.first_error.message


def test_a_raising_all_reduce_is_loud_on_the_rank_it_hits(tmp_path):
    result = run_case(tmp_path, fault={"kind": "collective_failure", "how": "raise", "rank": 0, "step": 6,
                                       "phase": "train"}, expect="fails_loudly",
                      timeouts={"collective": 30, "phase": 60})
    error = result.verdict.first_error
    assert error.rank == 0 and error.type == "InjectedCollectiveFailure" and "all_reduce on rank 0" in error.message
    assert result.verdict.restored_step == 4
