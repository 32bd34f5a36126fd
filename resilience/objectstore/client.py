"""What a rank's S3 clients get: credentials, a region, the endpoint (the fault proxy on
loopback), no instance-metadata lookup; and a guard that refuses any connection or name lookup
that would leave 127.0.0.1.

botocore (and the CRT client) fall back to a link-local metadata address when no credentials are
found; ``AWS_EC2_METADATA_DISABLED=true`` and explicit credentials keep them from trying, and the
guard turns a slip into a recorded, refused connection instead of traffic off the machine.
Standard library only: this runs inside ranks, before any S3 client is imported.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Any, Callable

ACCESS_KEY = "resilience"  # moto accepts any key; a fixed one keeps the requests reproducible
SECRET_KEY = "resilience-secret"
REGION = "us-east-1"
LOOPBACK_NAMES = ("localhost",)


def client_environment(endpoint: str, own_credentials: bool = False) -> dict[str, str]:
    """The environment every process that talks to the case's store runs with; ``own_credentials``:
    a store the user named, whose credentials the process already has in its environment."""
    found = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}
    if own_credentials:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or REGION
        return {**found, "AWS_REGION": region, "AWS_DEFAULT_REGION": region}
    return {**found, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
            # the user's own profiles must not decide what a case does
            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def is_loopback(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def install_loopback_guard(record: Callable[..., None], allowed_host: str | None = None) -> None:
    """Refuse (``PermissionError``) every Python-level ``socket.connect`` and name lookup of this
    process that is not for a loopback address (or ``allowed_host``, the endpoint of a store the
    user named, and the addresses it resolves to), after ``record(event, **fields)``. Native code
    that opens sockets itself (gloo, the CRT client) is not seen."""
    allowed = set()
    if allowed_host and not is_loopback(allowed_host):
        allowed = {allowed_host} | {info[4][0] for info in socket.getaddrinfo(allowed_host, None)}

    def guard(event: str, args: tuple) -> None:
        if event == "socket.connect":
            sock, address = args
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or is_loopback(address[0]) or address[0] in allowed:
                return
            host = address[0]
        elif event == "socket.getaddrinfo":
            host = args[0]
            if host is None or is_loopback(host) or host in allowed:
                return
        else:
            return
        record("outbound_connection", host=str(host), call=event)
        raise PermissionError(f"connection to {host!r} refused: this case's S3 traffic stays on 127.0.0.1")

    sys.addaudithook(guard)


def enter(store: dict, record: Callable[..., None]) -> None:
    """Set up this rank process (and the processes it starts) for the case's object store."""
    os.environ.update(client_environment(store["endpoint"], bool(store.get("own_credentials"))))
    install_loopback_guard(record, store.get("allowed_host"))
