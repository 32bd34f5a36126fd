"""An HTTP fault proxy on loopback, between the ranks' S3 clients and the S3 server.

Every request is relayed on a connection of its own (the proxy answers ``Connection: close``) and
logged as one JSON line: time, method, key (relative to the case's prefix), query, status, body
bytes seen, and the rule that acted. Rules (`ProxyRule`) act on the requests that match a method, a
key glob and, for copies, the ``x-amz-copy-source`` header: from the Nth matching request on, for
``count`` requests or ``for_s`` seconds, the proxy answers 503 SlowDown or 500 InternalError
(after reading the body, as S3 does), resets the connection after ``after_bytes`` of the body
reached the server, delays the request, or has the client process killed (after ``after_bytes``
of the body, or once the server answered and before the answer reaches the client).

Which process sent a request is read from the kernel (``/proc/net/tcp`` and ``/proc/PID/fd``),
so a rule reaches the rank that really made the call. Standard library only.
"""
from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlsplit

from . import wire

ACTIONS = ("slow_down", "internal_error", "reset", "delay", "kill")
METHODS = ("PUT", "GET", "HEAD", "POST", "DELETE", "*")
ERRORS = {"slow_down": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
          "internal_error": (500, "Internal Server Error", "InternalError",
                             "We encountered an internal error. Please try again.")}


@dataclass(frozen=True)
class ProxyRule:
    """What the proxy does to the requests that match ``method`` and the ``key`` glob (and, with
    ``copy`` set, only copies, or only non-copies): from the ``nth`` matching one on, ``count`` of
    them (or every one within ``for_s`` seconds of the first it acted on)."""

    action: str
    method: str = "*"
    key: str = "*"
    copy: bool | None = None  # True: only server-side copies (x-amz-copy-source); False: never them
    nth: int = 1
    count: int = 1
    for_s: float | None = None
    after_bytes: int | None = None  # reset, kill: that much of the body reaches the server first
    delay_s: float = 0.0


@dataclass(frozen=True)
class Request:
    method: str
    key: str
    query: str
    copy_source: str | None
    client_port: int


class _RuleState:
    def __init__(self, rule: ProxyRule):
        self.rule, self.matched, self.acted, self.first_at = rule, 0, 0, None

    def takes(self, request: Request) -> bool:
        rule = self.rule
        if rule.method not in ("*", request.method) or not fnmatchcase(request.key, rule.key):
            return False
        if rule.copy is not None and rule.copy != (request.copy_source is not None):
            return False
        self.matched += 1
        if self.matched < rule.nth:
            return False
        now = time.monotonic()
        if rule.for_s is not None:
            if self.first_at is not None and now - self.first_at > rule.for_s:
                return False
        elif self.acted >= rule.count:
            return False
        self.first_at = self.first_at or now
        self.acted += 1
        return True


class FaultProxy:
    """Listens on 127.0.0.1 (a port of its own), relays to ``upstream``. ``bucket`` and ``prefix``
    make the logged keys relative to the case's checkpoint root. ``on_act(rule, request, pid)`` is
    called before a rule acts (``pid``: the client process, None when unknown) and returns whether
    it may; `kill` is done by the caller's ``kill(pid)``."""

    def __init__(self, upstream: tuple[str, int], bucket: str, prefix: str, log_path: Path):
        self.upstream, self.bucket, self.prefix, self.log_path = upstream, bucket, prefix.strip("/"), log_path
        self.rules: list[_RuleState] = []
        self.on_act: Callable[[ProxyRule, Request, int | None], bool] = lambda rule, request, pid: True
        self.kill: Callable[[int], None] = lambda pid: None
        self._lock = threading.Lock()
        self._log = open(log_path, "a", buffering=1, encoding="utf-8")
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        self._log.close()

    def add(self, rule: ProxyRule) -> None:
        with self._lock:
            self.rules.append(_RuleState(rule))

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    # -- one connection, one request ------------------------------------------------------------
    def _serve(self, client: socket.socket) -> None:
        client.settimeout(120)
        reader = client.makefile("rb")
        head = wire.read_head(reader)
        if head is None:
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if ":" in line]
        named = {name.lower(): value for name, value in headers}
        request = Request(method, self._key(target), urlsplit(target).query,
                          named.get("x-amz-copy-source"), client.getpeername()[1])
        with self._lock:
            rule = next((state.rule for state in self.rules if state.takes(request)), None)
        pid = wire.client_pid(request.client_port, self.port) if rule else None
        if rule and not self.on_act(rule, request, pid):
            rule = None
        entry = {"time": time.time(), **asdict(request), "rule": asdict(rule) if rule else None, "pid": pid}
        if named.get("expect", "").lower() == "100-continue":
            client.sendall(f"{version} 100 Continue\r\n\r\n".encode())
        body = wire.body(reader, named)
        reply = None
        try:
            outcome, reply = self._relay(method, target, version, headers, body, rule, pid)
            entry.update(outcome)
        finally:
            self._write(entry)  # before the reply: a client that has its answer finds the request logged
            try:
                if reply is not None:
                    client.sendall(reply)
            finally:
                reader.close()
                wire.close(client, reset=bool(rule and rule.action == "reset"))

    def _relay(self, method, target, version, headers, body, rule, pid) -> tuple[dict, bytes | None]:
        """Forward one request (or answer it as ``rule`` says): what to log, and the reply to send."""
        action = rule.action if rule else None
        if action in ERRORS:
            sent = sum(len(piece) for piece in body)  # the body is read first, as S3 does
            status, reason, code, message = ERRORS[action]
            return {"status": status, "body_bytes": sent}, wire.error_response(version, status, reason, code, message)
        if action == "delay":
            time.sleep(rule.delay_s)
        cut = None
        if action == "reset" or (action == "kill" and rule.after_bytes is not None):
            cut = rule.after_bytes or 0
        kept = [(n, v) for n, v in headers if n.lower() not in ("connection", "expect")]
        upstream = socket.create_connection(self.upstream, timeout=120)
        try:
            upstream.sendall((f"{method} {target} {version}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in kept)
                              + "Connection: close\r\n\r\n").encode("latin-1"))
            sent = 0
            for piece in body:
                if cut is not None and sent + len(piece) >= cut:
                    upstream.sendall(piece[:cut - sent])
                    sent = cut
                    if action == "kill":
                        self.kill(pid)
                    return {"status": None, "body_bytes": sent, "cut": True}, None
                upstream.sendall(piece)
                sent += len(piece)
            response = wire.read_all(upstream)
        finally:
            upstream.close()
        if action == "kill":  # the server did it; the client never hears so
            self.kill(pid)
            return {"status": wire.status(response), "body_bytes": sent, "answer_withheld": True}, None
        return {"status": wire.status(response), "body_bytes": sent}, wire.close_header(response)

    def _key(self, target: str) -> str:
        path = unquote(urlsplit(target).path).lstrip("/")
        bucket, _, key = path.partition("/")
        if bucket != self.bucket:
            return path
        if self.prefix and (key == self.prefix or key.startswith(self.prefix + "/")):
            key = key[len(self.prefix):].lstrip("/")
        return key

    def _write(self, entry: dict) -> None:
        with self._lock:
            self._log.write(json.dumps(entry) + "\n")


def read_log(path: Path) -> list[dict]:
    """Every request the proxy logged, in order."""
    try:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def attempts(log: list[dict], method: str, key_glob: str) -> int:
    """How many times the clients sent a request matching ``method`` and ``key_glob``: one more
    than the number of retries when a single call was meant."""
    return sum(1 for e in log if e["method"] == method and fnmatchcase(e["key"], key_glob))
