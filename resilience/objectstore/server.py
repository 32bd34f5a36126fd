"""A real S3 API on loopback for one case: moto's server mode on 127.0.0.1 (a port of its own),
the fault proxy in front of it, and a bucket made for the case and removed with it.

The harness process only: moto and boto3 are imported here, never in a rank or the fork server.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import Unavailable
from .client import ACCESS_KEY, REGION, SECRET_KEY
from .proxy import FaultProxy

INSTALL = "pip install -e '.[s3]'"
PREFIX = "checkpoints"  # the case's checkpoint root inside its bucket
KINDS = ("s3",)


def missing() -> str | None:
    """What is missing to run an S3 case here (None: nothing)."""
    import importlib.util

    absent = [name for name in ("moto", "boto3", "s3fs", "flask") if importlib.util.find_spec(name) is None]
    return f"{', '.join(absent)} not installed ({INSTALL})" if absent else None


class S3Store:
    """Start with `start`, end with `stop` (always; it removes what `start` made even after a
    partial start). ``url``: the case's checkpoint root; ``endpoint``: what the ranks talk to."""

    def __init__(self, case_dir: Path):
        digest = hashlib.sha256(str(case_dir).encode()).hexdigest()[:16]
        self.bucket = f"resilience-{digest}"
        self.prefix = PREFIX
        self.case_dir = case_dir
        self.server = self.proxy = self._client = None

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def endpoint(self) -> str:
        return self.proxy.url

    @property
    def log_path(self) -> Path:
        return self.case_dir / "s3_requests.jsonl"

    def plan(self) -> dict:
        """What every rank gets (`resilience.objectstore.client.enter`)."""
        return {"url": self.url, "endpoint": self.endpoint}

    def start(self) -> "S3Store":
        problem = missing()
        if problem:
            raise Unavailable(f"object_store: s3 needs {problem}")
        import logging

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise; the proxy logs them

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        # explicit credentials and endpoint: the controller's own lookup chain never runs
        self._client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name=REGION,
                                    aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        self._client.create_bucket(Bucket=self.bucket)
        self.proxy = FaultProxy((host, port), self.bucket, PREFIX, self.log_path).start()
        return self

    def sizes(self, prefix: str | None = None) -> dict[str, int]:
        """Every object under ``prefix`` (default: the case's; "": the whole bucket): key -> size,
        straight from the server, not through the proxy."""
        found = {}
        prefix = f"{self.prefix}/" if prefix is None else prefix
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            found.update((entry["Key"], entry["Size"]) for entry in page.get("Contents", ()))
        return found

    def keys(self) -> list[str]:
        return list(self.sizes())

    def uploads(self, prefix: str | None = None) -> list[dict]:
        """Multipart uploads under ``prefix`` (as in ``sizes``) begun and never completed nor aborted."""
        prefix = f"{self.prefix}/" if prefix is None else prefix
        answer = self._client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        return list(answer.get("Uploads", ()))

    def incomplete_uploads(self) -> list[str]:
        return [upload["Key"] for upload in self.uploads()]

    def stop(self) -> None:
        try:
            if self.proxy is not None:
                self.proxy.stop()
            if self._client is not None:
                self.record_contents("end")
                self._remove_bucket()
        finally:
            if self.server is not None:
                self.server.stop()
            self.server = self.proxy = self._client = None

    def contents_path(self, when: str) -> Path:
        return self.case_dir / f"s3_objects.{when}.json"

    def record_contents(self, when: str) -> None:
        """What the bucket holds now (keys relative to the checkpoint root, and multipart uploads
        never completed), kept with the case's files as evidence: after the first run, and at the end."""
        import json

        strip = len(self.prefix) + 1
        sizes = self.sizes()
        self.contents_path(when).write_text(json.dumps({
            "objects": sorted(key[strip:] for key in sizes), "bytes": sum(sizes.values()),
            "incomplete_uploads": sorted(key[strip:] for key in self.incomplete_uploads())}, indent=1))

    def remove_objects(self, prefix: str | None = None) -> None:
        """Abort every multipart upload and delete every object under ``prefix`` (as in ``sizes``)."""
        for upload in self.uploads(prefix):
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        for key in self.sizes(prefix):
            self._client.delete_object(Bucket=self.bucket, Key=key)

    def _remove_bucket(self) -> None:
        self.remove_objects("")
        self._client.delete_bucket(Bucket=self.bucket)

    def buckets(self) -> list[str]:
        return [entry["Name"] for entry in self._client.list_buckets().get("Buckets", ())]
