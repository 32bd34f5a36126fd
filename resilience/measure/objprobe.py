"""Raw PUT and GET bandwidth of an S3 store: the ceiling a checkpoint save (PUT) and restore (GET)
can reach there, as ``fsprobe`` is for a directory.

A bounded probe: one object of ``size_bytes`` of incompressible data put in one request, read
back whole, then deleted. Its figures mean something only next to figures of the same run.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

from .environment import ObjectStoreTarget

MAX_SIZE = 1 << 30  # a single PUT, well below S3's 5 GiB limit


@dataclass(frozen=True)
class ObjectBandwidthProbe:
    url: str
    size_bytes: int
    put_s: float
    get_s: float

    @property
    def put_bytes_per_s(self) -> float:
        return self.size_bytes / self.put_s if self.put_s > 0 else 0.0

    @property
    def get_bytes_per_s(self) -> float:
        return self.size_bytes / self.get_s if self.get_s > 0 else 0.0


def describe_store(store) -> ObjectStoreTarget:
    """What the store is: its endpoint, bucket and prefix, and the server's own name for itself
    (the ``Server`` header of its answer to a HEAD of the bucket)."""
    return ObjectStoreTarget(endpoint=store.endpoint, bucket=store.bucket, prefix=store.root_prefix,
                             server=store.server_name())


def measure_object_bandwidth(store, size_bytes: int) -> ObjectBandwidthProbe:
    """PUT ``size_bytes`` into a new object under the store's prefix, GET it back, time both;
    the object is deleted either way."""
    if not 0 < size_bytes <= MAX_SIZE:
        raise ValueError(f"probe size {size_bytes} bytes; allowed: 1..{MAX_SIZE}")
    body = os.urandom(size_bytes)  # random: nothing on the way compresses it
    key = f"{store.prefix}/.resilience-probe-{uuid.uuid4().hex}"
    client = store.client()
    try:
        started = time.monotonic()
        client.put_object(Bucket=store.bucket, Key=key, Body=body)
        put_s = time.monotonic() - started
        started = time.monotonic()
        got = client.get_object(Bucket=store.bucket, Key=key)["Body"].read()
        get_s = time.monotonic() - started
    finally:
        client.delete_object(Bucket=store.bucket, Key=key)
    if got != body:
        raise RuntimeError(f"s3://{store.bucket}/{key}: the object read back differs from the one put")
    return ObjectBandwidthProbe(url=store.url, size_bytes=size_bytes, put_s=put_s, get_s=get_s)
