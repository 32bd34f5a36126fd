"""HTTP/1.1 framing as the fault proxy relays it (bytes kept as they came), and who holds the
other end of a loopback connection. Standard library only."""
from __future__ import annotations

import os
import socket
import struct

PIECE = 64 * 1024


def client_pid(client_port: int, proxy_port: int) -> int | None:
    """The process holding the client end of a loopback connection to ``proxy_port``."""
    wanted_local, wanted_remote = f"0100007F:{client_port:04X}", f"0100007F:{proxy_port:04X}"
    inode = None
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == wanted_local and fields[2] == wanted_remote:
                inode = fields[9]
    if inode is None:
        return None
    link = f"socket:[{inode}]"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") == link for fd in os.listdir(f"/proc/{entry}/fd")):
                return int(entry)
        except OSError:  # gone, or not ours to read
            continue
    return None


def read_head(reader) -> bytes | None:
    lines = []
    while True:
        line = reader.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            return b"".join(lines).rstrip(b"\r\n")
        lines.append(line)


def body(reader, headers: dict):
    """The request body as it arrives, its framing kept (Content-Length or chunked)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = reader.readline(1024)
            yield size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:
                    trailer = reader.readline(65537)
                    yield trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return
            yield reader.read(size + 2)
        return
    remaining = int(headers.get("content-length", "0"))
    while remaining > 0:
        piece = reader.read(min(PIECE, remaining))
        if not piece:
            return
        remaining -= len(piece)
        yield piece


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = sock.recv(PIECE)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def status(response: bytes) -> int | None:
    try:
        return int(response.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def close_header(response: bytes) -> bytes:
    head, sep, rest = response.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"Connection: close"]) + sep + rest


def error_response(version: str, status: int, reason: str, code: str, message: str) -> bytes:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>fault-proxy</RequestId></Error>").encode()
    return (f"{version} {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def close(sock: socket.socket, reset: bool) -> None:
    if reset:  # SO_LINGER 0: the close sends RST, as a middlebox dropping the connection does
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:
        sock.close()
    except OSError:
        pass
