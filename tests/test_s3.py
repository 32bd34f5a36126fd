"""Checkpoints in object storage: moto's real S3 server on loopback, the fault proxy before it,
the guard that keeps S3 traffic on 127.0.0.1, and whole cases through the harness."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from resilience.core.case import VerdictKind
from resilience.errors import ScenarioError
from resilience.objectstore.client import ACCESS_KEY, REGION, SECRET_KEY, client_environment
from resilience.objectstore.proxy import ProxyRule, attempts, read_log
from resilience.objectstore.server import missing

from .harness_helpers import case_from, run_case

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"object storage: {missing()}")

S3_DCP = {"strategy": {"name": "dcp", "options": {"storage": "fsspec"}}, "object_store": "s3",
          "workload": {"model": "mlp", "world_size": 2, "steps": 8, "checkpoint_every": 4, "seed": 0}}


@pytest.fixture
def store(tmp_path):
    from resilience.objectstore.server import S3Store

    started = S3Store(tmp_path).start()
    try:
        yield started
    finally:
        started.stop()


def client(endpoint: str, attempts_allowed: int | None = None):
    import boto3
    from botocore.config import Config

    retries = {"total_max_attempts": attempts_allowed, "mode": "standard"} if attempts_allowed else None
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY, config=Config(retries=retries) if retries else None)


def test_slow_down_is_retried_by_botocore_and_fails_without_retries(store):
    store.proxy.add(ProxyRule(action="slow_down", method="PUT", key="a/*"))
    s3 = client(store.endpoint)
    s3.put_object(Bucket=store.bucket, Key="checkpoints/a/shard", Body=b"x" * 10_000)
    log = read_log(store.log_path)
    assert [e["status"] for e in log if e["key"] == "a/shard"] == [503, 200]
    assert attempts(log, "PUT", "a/*") == 2  # one retry, counted from the proxy's log

    from botocore.exceptions import ClientError

    store.proxy.add(ProxyRule(action="slow_down", method="PUT", key="b/*"))
    with pytest.raises(ClientError, match="SlowDown"):
        client(store.endpoint, attempts_allowed=1).put_object(Bucket=store.bucket, Key="checkpoints/b/shard",
                                                              Body=b"x")
    assert "checkpoints/b/shard" not in store.keys()


def test_reset_mid_body_stores_nothing_and_the_nth_rule_waits_its_turn(store):
    from botocore.exceptions import BotoCoreError

    store.proxy.add(ProxyRule(action="reset", method="PUT", key="c/*", nth=2, after_bytes=100))
    one_try = client(store.endpoint, attempts_allowed=1)
    one_try.put_object(Bucket=store.bucket, Key="checkpoints/c/first", Body=b"y" * 5000)  # the 1st: relayed
    with pytest.raises(BotoCoreError):
        one_try.put_object(Bucket=store.bucket, Key="checkpoints/c/second", Body=b"y" * 5000)
    assert "checkpoints/c/first" in store.keys() and "checkpoints/c/second" not in store.keys()
    cut = [e for e in read_log(store.log_path) if e["key"] == "c/second"]
    assert cut[0]["cut"] and cut[0]["body_bytes"] == 100


def test_store_leaves_no_server_port_bucket_or_thread(tmp_path):
    from resilience.objectstore.server import S3Store

    before = {t.ident for t in threading.enumerate()}
    store = S3Store(tmp_path).start()
    host, port = store.server.get_host_and_port()
    proxy_port = store.proxy.port
    assert store.bucket in store.buckets()
    store.stop()
    for listening in (port, proxy_port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, listening), timeout=5).close()
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not left, left


GUARDED_LOOKUP = """
import json, sys
from resilience.objectstore.client import install_loopback_guard
seen = []
install_loopback_guard(lambda event, **fields: seen.append(fields["host"]))
import botocore.session
credentials = botocore.session.get_session().get_credentials()
print(json.dumps({"seen": seen, "found": credentials is not None}))
"""


@pytest.mark.parametrize("configured", [False, True])
def test_no_connection_leaves_loopback(tmp_path, configured):
    """Without credentials and with the metadata lookup left on, botocore's chain reaches for the
    link-local metadata address: the guard records and refuses it (the check can fail). With the
    environment every rank gets, nothing is looked up off the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_METADATA_SERVICE_TIMEOUT="1", AWS_METADATA_SERVICE_NUM_ATTEMPTS="1")
    if configured:
        env.update(client_environment("http://127.0.0.1:9"))
    done = subprocess.run([sys.executable, "-c", GUARDED_LOOKUP], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if configured:
        assert report == {"seen": [], "found": True}
    else:
        assert "169.254.169.254" in report["seen"] and not report["found"]


def test_object_store_keys_are_checked():
    with pytest.raises(ScenarioError, match=r"strategy\.options\.storage.*fsspec"):
        case_from(**{**S3_DCP, "strategy": "dcp"})
    with pytest.raises(ScenarioError, match="object_store: missing"):
        case_from(fault={"kind": "s3", "action": "slow_down"})
    with pytest.raises(ScenarioError, match="object_store"):
        case_from(object_store="gcs")
    with pytest.raises(ScenarioError, match="fault.after_bytes"):
        case_from(**S3_DCP, fault={"kind": "s3", "action": "reset"})
    with pytest.raises(ScenarioError, match="s3torchconnector writes to an object store only"):
        case_from(strategy={"name": "dcp", "options": {"storage": "s3torchconnector"}})


def _rank_events(work_dir: Path) -> list[dict]:
    return [json.loads(line) for path in work_dir.glob("*/rank*.events.jsonl")
            for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_dcp_in_s3_survives_a_slow_down_and_stays_on_loopback(tmp_path):
    result = run_case(tmp_path, keep=True, **S3_DCP,
                      fault={"kind": "s3", "action": "slow_down", "key": "step_00000008/__1_0.distcp"})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict
    log = read_log(result.work_dir / "s3_requests.jsonl")
    shard = [e["status"] for e in log if e["method"] == "PUT" and e["key"] == "step_00000008/__1_0.distcp"]
    assert shard[:2] == [503, 200]  # s3fs (through aiobotocore) retried the throttled PUT once
    events = _rank_events(result.work_dir)
    assert any(e["event"] == "fault_fired" and e["rank"] == 1 for e in events)
    assert not [e for e in events if e["event"] == "outbound_connection"]
    assert {e["key"] for e in log} and all(e["client_port"] for e in log)


@pytest.mark.slow
def test_dcp_in_s3_rank_killed_inside_a_multipart_upload_leaves_it_incomplete(tmp_path):
    result = run_case(tmp_path, keep=True, **{
        **S3_DCP, "workload": {**S3_DCP["workload"], "size": "4MiB"},
        "strategy": {"name": "dcp", "options": {"storage": "fsspec", "part_size": "5MiB"}}}, fault={
        "kind": "s3", "action": "kill", "key": "step_00000008/__1_0.distcp", "nth": 2, "after_bytes": 4096})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict
    assert result.phases[-1].restored()[0]["step"] == 4
    bucket = json.loads((result.work_dir / "s3_objects.first_run.json").read_text())
    assert "step_00000004/.metadata" in bucket["objects"]
    assert not {"step_00000008/__1_0.distcp", "step_00000008/.metadata"} & set(bucket["objects"])
    assert bucket["incomplete_uploads"] == ["step_00000008/__1_0.distcp"]
    parts = [e for e in read_log(result.work_dir / "s3_requests.jsonl") if e["key"] == "step_00000008/__1_0.distcp"
             and "partNumber=" in e["query"]]
    assert parts[0]["status"] == 200 and parts[1].get("cut")  # part 1 stored, part 2 cut by the kill


def test_fork_server_preload_imports_no_s3_client():
    """s3fs starts an IO thread on first use and the fork server must stay single-threaded: no
    asynchronous S3 client is imported by its preload (a rank imports s3fs itself, after the fork).
    boto3 and botocore may come in: Accelerate 1.15.0 imports boto3 where it is installed
    (accelerate/commands/config/sagemaker.py:34, reached from the Trainer's preload), and importing
    them starts no thread (the thread count below says so)."""
    code = ("import sys; import resilience.rank.zygote as z; print(z.THREADS_AFTER_PRELOAD, "
            "[m for m in ('s3fs', 'aiobotocore', 'moto') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(None, 1) == ["1", "[]\n"]


def test_file_points_and_file_only_faults_are_refused_on_objects():
    with pytest.raises(ScenarioError, match="fault.point: reaches files only"):
        case_from(**S3_DCP, fault={"kind": "kill", "rank": 1, "step": 8, "point": "write", "after_bytes": 10})
    with pytest.raises(ScenarioError, match="acts on files, not on objects"):
        case_from(**S3_DCP, fault={"kind": "stale_pointer", "rank": 0, "step": 8, "file": "latest"})
    assert case_from(**S3_DCP, fault={"kind": "bit_flip", "rank": 0, "step": 8}).object_store == "s3"


@pytest.mark.slow
def test_torch_save_killed_inside_a_multipart_upload_leaves_it_incomplete_and_no_object(tmp_path):
    """torch.save streams into s3fs's file: with a 5 MiB part size a 6 MiB file goes up in parts,
    and the rank killed inside the second leaves an upload that never completes (no object)."""
    result = run_case(tmp_path, keep=True, strategy={"name": "torch.rank0", "options": {"part_size": "5MiB"}},
                      object_store="s3", workload={**S3_DCP["workload"], "size": "2MiB"},
                      fault={"kind": "s3", "action": "kill", "key": "step_00000008/model_optim.pt", "nth": 2,
                             "after_bytes": 4096})
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict
    assert result.phases[-1].restored()[0]["step"] == 4
    bucket = json.loads((result.work_dir / "s3_objects.first_run.json").read_text())
    assert bucket["objects"] == ["step_00000004/model_optim.pt"]
    assert bucket["incomplete_uploads"] == ["step_00000008/model_optim.pt"]
    parts = [e for e in read_log(result.work_dir / "s3_requests.jsonl") if e["key"] == "step_00000008/model_optim.pt"
             and "partNumber=" in e["query"]]
    assert parts[0]["status"] == 200 and parts[1].get("cut")
    assert json.loads((result.work_dir / "s3_objects.end.json").read_text())["bytes"] > 0  # sizes are recorded
