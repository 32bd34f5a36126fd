"""An S3 store the user names (``resilience qualify --workdir s3://BUCKET/PREFIX --endpoint URL``):
the store to qualify, not one the harness starts. Each case writes under a prefix of its own
inside PREFIX and its objects (and multipart uploads) are removed with it; the bucket is the
user's and stays. No fault proxy stands in front of it, so the ``s3`` fault cannot run on it.

Harness process only (boto3 is imported here). The ranks get the endpoint; with credentials in
the harness's environment (``AWS_ACCESS_KEY_ID``) they keep them, otherwise they get the fixed
ones the loopback server accepts; and the loopback guard lets through the endpoint's host too.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ResilienceError, Unavailable
from .client import ACCESS_KEY, REGION, SECRET_KEY
from .server import S3Store, missing


def split_url(url: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` -> (BUCKET, PREFIX without slashes at either end)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ResilienceError(f"--workdir {url!r}: not an S3 URL; allowed: s3://BUCKET or s3://BUCKET/PREFIX")
    return parts.netloc, parts.path.strip("/")


def check_endpoint(endpoint: str | None) -> str:
    parts = urlsplit(endpoint or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ResilienceError(f"--endpoint {endpoint!r}: not an endpoint URL; allowed: http(s)://HOST[:PORT] "
                              f"(or AWS_ENDPOINT_URL in the environment)")
    return endpoint


def own_credentials() -> bool:
    """Whether the harness's environment names credentials the ranks should keep."""
    return bool(os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"))


class ExternalStore(S3Store):
    """``start`` checks that the bucket answers; ``stop`` records and removes the case's objects."""

    def __init__(self, url: str, endpoint: str, case_dir: Path):
        super().__init__(case_dir)
        self.bucket, self.root_prefix = split_url(url)  # the user's prefix; the case's own is under it
        self.prefix = f"{self.root_prefix}/{case_dir.name}" if self.root_prefix else case_dir.name
        self.given_endpoint = check_endpoint(endpoint)

    @property
    def endpoint(self) -> str:
        return self.given_endpoint

    def plan(self) -> dict:
        return {"url": self.url, "endpoint": self.endpoint, "own_credentials": own_credentials(),
                "allowed_host": urlsplit(self.endpoint).hostname}

    def client(self):
        import boto3

        keys = {} if own_credentials() else {"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=os.environ.get("AWS_REGION", REGION), **keys)

    def server_name(self) -> str:
        """The ``Server`` header of the store's answer to a HEAD of the bucket ("" if none)."""
        answer = self._client.head_bucket(Bucket=self.bucket)
        return answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("server", "")

    def start(self) -> "ExternalStore":
        problem = missing()
        if problem:
            raise Unavailable(f"an S3 work directory needs {problem}")
        from botocore.exceptions import BotoCoreError, ClientError

        self._client = self.client()
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            self._client = None
            raise ResilienceError(f"bucket {self.bucket!r} at {self.endpoint}: {exc}") from None
        return self

    def stop(self) -> None:
        if self._client is None:
            return
        try:
            self.record_contents("end")
            self.remove_objects()
        finally:
            self._client = None
