"""Real network faults (root): ranks in network namespaces, an nftables partition or a tbf throttle on
one rank's link, and a teardown that leaves no namespace behind whatever happened."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import HarnessError
from resilience.faults.base import CaseEnvironment, FaultUnavailable
from resilience.faults.network import netns
from resilience.faults.network import partition as network
from resilience.faults.network.netns import NamespaceWiring
from resilience.faults.network.partition import NetworkError, Partition, Throttle
from resilience.run.harness import Harness
from resilience.run.reference_cache import ReferenceCache

from .harness_helpers import case_from
from .test_loader import scenario_error, variant

TIMEOUT_S = 15
MARGIN_S = 10  # a rank notices a timed-out collective on its next poll; 2 loaded cores add more


def network_missing() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc", "nft") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}: apt-get install iproute2 nftables (as root)" if missing else None


needs_network = pytest.mark.skipif(network_missing() is not None, reason=str(network_missing()))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One reference run for the whole module: every case here has the same workload."""
    return ReferenceCache(tmp_path_factory.mktemp("references"))


def run(tmp_path, cache, fault, steps=12, world_size=2, **overrides):
    case = case_from(fault=fault, workload={"steps": steps, "world_size": world_size},
                     timeouts={"collective": TIMEOUT_S, "phase": 120}, **overrides)
    try:
        result = Harness(work_root=tmp_path, keep=True, cache=cache).run(case)
    except FaultUnavailable as exc:
        pytest.skip(f"{fault['kind']} unavailable here: {exc}")
    # this process's harness made them (another xdist worker's may exist meanwhile): none is left
    assert not [name for name in netns.list_namespaces() if name.startswith(f"resilience-{os.getpid()}-")]
    record = json.loads((result.work_dir / network.RECORD).read_text())
    assert record["removed"] is True and record["switch"].startswith(f"resilience-{os.getpid()}-")
    for phase in result.phases[1:]:
        for pid in {e["pid"] for rank in phase.ranks for e in rank.events}:
            assert not Path(f"/proc/{pid}").exists(), f"rank process {pid} of {phase.name} survived"
    return result, record


def partition(seconds, phase="save", step=8):
    return {"kind": "partition", "rank": 1, "step": step, "phase": phase, "seconds": seconds}


@needs_network
def test_short_partition_in_the_saves_barrier_only_delays_and_gloo_really_used_the_veths(tmp_path, cache):
    result, record = run(tmp_path, cache, partition(3))
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    first_run = result.phases[1]
    assert first_run.status == "completed" and first_run.elapsed_s >= 3
    assert [e["rank"] for e in first_run.fault_events] == [1]
    assert 3 <= record["lifted_at"] - record["applied_at"] < 3 + MARGIN_S
    # each rank joined its own namespace with its own address, and the collectives crossed the veths
    joined = {e["rank"]: e for e in first_run.events("network_joined")}
    assert [joined[r]["address"] for r in (0, 1)] == ["10.213.0.1", "10.213.0.2"]
    assert [joined[r]["namespace"] for r in (0, 1)] == [r["namespace"] for r in record["ranks"]]
    for counters in record["counters"].values():  # 12 all-reduces of 64 KiB gradients, each way
        assert counters["rx_bytes"] > 300_000 and counters["tx_bytes"] > 300_000, record["counters"]
    # the restart runs on loopback, outside any namespace
    assert not result.phases[2].events("network_joined")


@needs_network
def test_partition_longer_than_the_timeout_is_loud_within_the_timeout_plus_a_margin(tmp_path, cache):
    result, record = run(tmp_path, cache, partition(40, phase="train", step=6), expect="fails_loudly")
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    error = result.verdict.first_error
    assert error.phase == "first_run" and "Timed out waiting 15000ms" in error.message
    assert TIMEOUT_S - 1 <= error.time - record["applied_at"] <= TIMEOUT_S + MARGIN_S
    assert record["lifted_at"] < record["applied_at"] + 40  # lifted by heal, once the first run ended


@needs_network
def test_a_node_partition_cuts_every_rank_of_the_node_off_the_other_nodes(tmp_path, cache):
    """``scope: node``: ranks 2 and 3 (node 1 of two) lose the other node in the step-6 all-reduce
    and time out; their rules spare each other's address, so only the nodes are cut apart."""
    fault = {**partition(40, phase="train", step=6), "rank": 2, "scope": "node"}
    result, record = run(tmp_path, cache, fault, world_size=4, expect="fails_loudly", topology={"nodes": 2})
    assert result.verdict.kind is VerdictKind.LOUD, result.verdict.findings
    assert record["impaired"] == [2, 3]
    # some rank's all-reduce timed out; the first error in time may instead be a node-0 rank's
    # "Connection closed by peer" from a peer that timed out and exited a moment earlier
    errors = [e["message"] for r in result.phases[1].ranks for e in r.events if e["event"] == "error"]
    assert any("Timed out waiting 15000ms" in message for message in errors), errors
    assert re.search(r"Timed out waiting 15000ms|Connection closed by peer", result.verdict.first_error.message)
    assert 'ip saddr != { 10.213.0.4 } drop' in network.Partition.rules(("10.213.0.4",))


@needs_network
def test_throttled_link_slows_each_allreduce_and_too_slow_a_link_is_loud(tmp_path, cache):
    slow, _ = run(tmp_path / "slow", cache, {"kind": "throttle", "rank": 1, "step": 6, "phase": "train",
                                                  "seconds": 6, "rate_kbit": 512})
    assert slow.verdict.kind is VerdictKind.RECOVERED, slow.verdict.findings
    losses = {e["step"]: e["time"] for e in slow.phases[1].ranks[0].events if e["event"] == "loss"}
    assert losses[6] - losses[5] >= 0.5  # 64 KiB each way at 512 kbit/s: about a second

    stuck, _ = run(tmp_path / "stuck", cache, {"kind": "throttle", "rank": 1, "step": 6, "phase": "train",
                                                    "seconds": 60, "rate_kbit": 8}, expect="fails_loudly")
    assert stuck.verdict.kind is VerdictKind.LOUD, stuck.verdict.findings
    assert "Timed out" in stuck.verdict.first_error.message


# -- setup and teardown, without rank processes -------------------------------------------------------

def environment(tmp_path, **overrides) -> CaseEnvironment:
    case = case_from(fault=partition(3), **overrides)
    return CaseEnvironment(case=case, case_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")


@needs_network
def test_teardown_removes_what_a_failed_setup_created(tmp_path, monkeypatch):
    fault = Partition(case_from(fault=partition(3)).fault)
    real_probe = Partition.probe

    def probe_then_fail(self):
        real_probe(self)
        raise NetworkError("probe failed on purpose")

    monkeypatch.setattr(Partition, "probe", probe_then_fail)
    env = environment(tmp_path)
    with pytest.raises(FaultUnavailable, match="probe failed on purpose"):
        fault.setup(env)
    assert len(fault.wiring.existing()) == 3  # switch + 2 ranks, still there: the harness's teardown follows
    fault.teardown(env)
    assert fault.wiring.existing() == []


@needs_network
def test_teardown_after_the_impairment_stayed_applied(tmp_path):
    """The first run ended (say, the harness itself raised) with the rule in place: heal lifts it,
    teardown removes the namespaces; teardown alone removes them too."""
    for heal in (True, False):
        fault = Throttle(case_from(fault={"kind": "throttle", "rank": 1, "step": 8, "seconds": 60,
                                          "rate_kbit": 8}).fault)
        env = environment(tmp_path)
        try:
            fault.setup(env)
            fault.apply(fault.wiring.ranks[1])
            fault.applied_at = 1.0
            if heal:
                fault.heal(env)
                assert fault.lifted_at is not None
        finally:
            fault.teardown(env)
        assert fault.wiring.existing() == []


@needs_network
def test_namespaces_of_a_dead_harness_are_removed_and_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = NamespaceWiring(1, prefix=f"resilience-{dead.pid}-abcdef"), NamespaceWiring(1)
    try:
        for wiring in (stale, live):
            wiring.create()
        removed = netns.remove_stale_namespaces()
        assert set(stale.names()) <= set(removed)
        assert stale.existing() == [] and sorted(live.existing()) == sorted(live.names())
    finally:
        stale.destroy()
        live.destroy()


def test_names_are_unique_per_case_and_interface_names_fit_ifnamsiz():
    first, second = NamespaceWiring(64), NamespaceWiring(64)
    assert not set(first.names()) & set(second.names())
    assert first.prefix.startswith(f"resilience-{os.getpid()}-")
    assert all(netns.NAME.match(name) for name in first.names())
    for rank in first.ranks:
        assert len(rank["ifname"].encode()) <= 15 and len(rank["port"].encode()) <= 15
    assert len(netns.BRIDGE) <= 15
    assert len({r["address"] for r in first.ranks}) == 64


def test_without_root_or_tools_the_fault_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    env = environment(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(FaultUnavailable, match="needs root"):
        Partition(env.case.fault).setup(env)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "nft" else f"/usr/sbin/{tool}")
    with pytest.raises(FaultUnavailable, match=r"needs `nft`, not found on PATH: apt-get install nftables \(as root\)"):
        Partition(env.case.fault).setup(env)
    assert issubclass(NetworkError, HarnessError)


def test_the_skip_reason_without_nftables_names_the_package_to_install(tmp_path, monkeypatch):
    """The reason a partition case is skipped for says what to run, whoever runs the suite."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nft, ip or tc on PATH
    assert Partition.unavailable_reason() == (
        "partition needs `ip`, `nft`, not found on PATH: apt-get install iproute2 nftables (as root)")
    (tmp_path / "ip").write_text("#!/bin/sh\n")
    (tmp_path / "ip").chmod(0o755)
    assert Partition.unavailable_reason() == (
        "partition needs `nft`, not found on PATH: apt-get install nftables (as root)")
    assert Throttle.unavailable_reason() == "throttle needs `tc`, not found on PATH: apt-get install iproute2 (as root)"


# -- scenario validation ------------------------------------------------------------------------------

NETWORK_BASE = variant({"fault": {"kind": "partition", "rank": 1, "step": 8, "seconds": 3}})


@pytest.mark.parametrize("changes,key,value,allowed", [
    ({"fault.seconds": 0}, "fault.seconds", 0, None),
    ({"fault.seconds": "long"}, "fault.seconds", "long", None),
    ({"fault.phase": "load"}, "fault.phase", "load", "train, save"),
    ({"fault.point": "write"}, "fault.point", "write", "start"),
    ({"fault.point": "start", "fault.after_bytes": 4096}, "fault.after_bytes", 4096, None),
    ({"fault.rate_kbit": 8}, "fault.rate_kbit", "rate_kbit", "seconds"),
    ({"fault.kind": "throttle"}, "fault.rate_kbit", None, None),
    ({"fault.kind": "throttle", "fault.rate_kbit": -8}, "fault.rate_kbit", -8, None),
], ids=["zero seconds", "seconds not a number", "unknown phase", "point other than start",
        "after_bytes has no meaning", "rate on a partition", "throttle without a rate", "negative rate"])
def test_bad_network_fault_names_file_key_value_and_allowed(changes, key, value, allowed):
    err = scenario_error(variant(changes, base=NETWORK_BASE))
    assert err.key == key, str(err)
    assert err.value == value, str(err)
    if allowed is not None:
        assert allowed in err.allowed, str(err)


def test_shipped_network_scenario_covers_both_kinds_and_both_outcomes():
    from resilience.scenario.loader import load_file

    scenario = load_file(Path(__file__).resolve().parents[1] / "scenarios" / "network_partition.scenario.yaml")
    kinds = {(case.fault.kind, case.expect.outcome.value) for case in scenario.cases}
    assert kinds == {("partition", "recovers"), ("partition", "fails_loudly"),
                     ("throttle", "recovers"), ("throttle", "fails_loudly")}
    for case in scenario.cases:  # robust on 2 loaded cores: every delay far from the timeout
        timeout = case.timeouts.collective_s
        assert timeout >= 15
        if case.fault.kind == "partition":  # TCP's retransmission backoff can double a short one
            delay = case.fault.params["seconds"]
            assert 2 * delay <= timeout - 5 or delay >= timeout + 5
        else:  # one all-reduce of the gradients (about workload.size bytes each way) at the rate
            delay = case.workload.size_bytes * 8 / 1000 / case.fault.params["rate_kbit"]
            assert delay <= timeout / 5 or (delay >= 2 * timeout and case.fault.params["seconds"] >= 2 * timeout)


@needs_network
def test_a_partition_on_an_unmodified_script_moves_its_ranks_into_namespaces_and_cuts_rank_1(tmp_path):
    """Black-box mode: the startup hook puts each rank of the first launch in a namespace of its own
    and points the launcher's MASTER_ADDR at rank 0's; the group's store and gloo cross the bridge."""
    from resilience.core.events import read_events
    from resilience.launch.warm_agent import live_agents
    from resilience.run.blackbox import BlackBoxJob, qualify_script

    from .procs import pids_naming

    script = Path(__file__).resolve().parent.parent / "examples" / "scripts" / "gpt_trainer.py"
    job = BlackBoxJob(script=script, args=("--out-dir", "{checkpoint_dir}"),
                      restart_args=("--out-dir", "{checkpoint_dir}", "--init-from", "resume"))
    result = qualify_script(job, {"kind": "partition", "rank": 1, "step": 6, "seconds": 3},
                            work_root=tmp_path, keep=True)
    try:
        assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
        record = json.loads((result.work_dir / "job" / network.RECORD).read_text())
        first_run = result.work_dir / "job" / "launch0.restart0"
        joined = [e for rank in (0, 1) for e in read_events(first_run / f"rank{rank}.events.jsonl")
                  if e["event"] == "network_joined"]
        assert sorted((e["rank"], e["address"]) for e in joined) == [(0, "10.213.0.1"), (1, "10.213.0.2")]
        assert record["impaired"] == [1] and record["removed"] is True
        assert record["lifted_at"] - record["applied_at"] >= 3
        # the collectives and the store crossed each rank's veth: far more than a few handshakes
        assert all(counts["tx_bytes"] > 100_000 for counts in record["counters"].values()), record["counters"]
        assert [e["rank"] for log in result.first_run for e in log.fault_events] == [1]
        assert not [name for name in netns.list_namespaces() if name.startswith(f"resilience-{os.getpid()}-")]
    finally:
        shutil.rmtree(result.work_dir)
    assert pids_naming(tmp_path) == [], "a rank or torchrun outlived the run"
    assert live_agents() == [], "a warm torchrun agent outlived the run"
