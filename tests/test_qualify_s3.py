"""`resilience qualify --workdir s3://BUCKET/PREFIX --endpoint URL`: a real S3 API (moto's server
on loopback, behind the fault proxy, started here) qualified as a filesystem is: the store, raw
PUT and GET, and a strategy's save and restore throughput as fractions of them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from resilience.commands import cli
from resilience.objectstore.proxy import read_log
from resilience.objectstore.server import missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"object storage: {missing()}")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path):
    from resilience.objectstore.server import S3Store

    (tmp_path / "server").mkdir()
    started = S3Store(tmp_path / "server").start()
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.slow
def test_qualify_reports_the_store_its_put_get_bandwidth_and_throughput_fractions(tmp_path, store):
    out = tmp_path / "report"
    url = f"s3://{store.bucket}/qualify"
    status = cli.main(["qualify", str(ROOT / "scenarios" / "no_fault.scenario.yaml"), "-k", "rank0",
                       "--out", str(out), "--workdir", url, "--endpoint", store.endpoint, "--no-cache",
                       "--probe-size", "4MiB", "--throughput-size", "1MiB", "--throughput-world-size", "2"])
    report = json.loads((out / "report.json").read_text())
    assert status == 0, report["notes"]
    env = report["environment"]
    assert env["checkpoint_dir"] == url and env["mount"] is None
    assert env["object_store"]["endpoint"] == store.endpoint
    assert (env["object_store"]["bucket"], env["object_store"]["prefix"]) == (store.bucket, "qualify")
    probe = report["object_bandwidth"]
    assert probe["size_bytes"] == 4 << 20 and probe["put_bytes_per_s"] > 0 and probe["get_bytes_per_s"] > 0
    assert report["bandwidth"] is None
    [figure] = report["throughput"]
    assert figure["strategy"] == "torch.rank0" and figure["verdict"] == "RECOVERED"
    assert figure["bytes_per_checkpoint"] > 1 << 20  # model, Adam moments: about 3 MiB per step
    assert figure["raw_bytes_per_s"] == probe["put_bytes_per_s"]
    assert figure["raw_read_bytes_per_s"] == probe["get_bytes_per_s"]
    assert figure["save_fraction"] > 0 and figure["restore_fraction"] > 0
    # the ranks' checkpoints went through the proxy into the named prefix, and nothing stayed
    log = read_log(store.log_path)
    assert any(e["method"] == "PUT" and e["key"].startswith("qualify/") and e["key"].endswith("model_optim.pt")
               for e in log)
    assert store.sizes("") == {} and store.uploads("") == []
    html = (out / "report.html").read_text()
    assert "Checkpoint object store" in html and 'id="raw-put"' in html and 'id="raw-get"' in html


def test_an_s3_workdir_needs_an_endpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    status = cli.main(["qualify", str(ROOT / "scenarios" / "no_fault.scenario.yaml"), "--out", str(tmp_path),
                       "--workdir", "s3://bucket/prefix"])
    assert status == 2 and "--endpoint None: not an endpoint URL" in capsys.readouterr().err
