"""Network namespaces for a case's ranks (root): created, wired to a bridge, joined, and removed.

Every rank of the first run gets a network namespace of its own holding ``veth0`` with
10.213.0.<rank + 1>/24; the other end of each veth pair, ``p<rank>``, is a port of the bridge ``br0``
in a switch namespace of the case's own. Nothing is added to the host's namespace: concurrent cases
use the same private addresses without seeing each other, and interface names (at most IFNAMSIZ - 1
= 15 bytes) only have to be unique inside their namespace. Namespace names carry the harness's pid
and a random token (``resilience-<pid>-<token>-r0``), so those left behind by a harness that no
longer exists (one killed before its teardown could run) can be found and removed.

A rank joins its namespace before ``torch.distributed`` starts (``setns`` on /run/netns/NAME: Python
3.11 has no ``os.setns``, so through libc; a forked rank is single-threaded and gloo's threads,
started later, inherit the namespace).
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import secrets
import subprocess
from pathlib import Path

from ...core import janitor
from ...core.processes import is_running
from ...errors import NetworkError

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
SUBNET = "10.213.0"  # private (RFC 1918), and only ever inside the case's own namespaces
IFNAME = "veth0"  # the rank's interface, inside its namespace
BRIDGE = "br0"
COMMAND_TIMEOUT_S = 30.0
NAME = re.compile(r"^resilience-(?P<pid>\d+)-(?P<token>[0-9a-f]{6})-(?:sw|[rn]\d+)$")


def run_command(argv: list[str], input_text: str | None = None) -> subprocess.CompletedProcess:
    """Run one network command; a failure or a hang is a `NetworkError` carrying the command's own words."""
    try:
        result = subprocess.run(argv, input=input_text, check=False, capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(argv)} did not finish within {COMMAND_TIMEOUT_S:g} s") from None
    if result.returncode:
        raise NetworkError(f"{' '.join(argv)} exited with status {result.returncode}: "
                           f"{(result.stderr or result.stdout).strip()}")
    return result


def list_namespaces() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def _delete_namespace(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True, timeout=COMMAND_TIMEOUT_S)


def remove_stale_namespaces() -> list[str]:
    """Namespaces of harnesses that died before their teardown: removed, and returned."""
    stale = [name for name in list_namespaces()
             if (match := NAME.match(name)) and not is_running(int(match.group("pid")))]
    for name in stale:
        _delete_namespace(name)
    return stale


class NamespaceWiring:
    """One case's namespaces: a switch with a bridge, and one namespace per member wired to it.

    Members are ranks (``member="r"``: the network faults) or whole nodes (``member="n"``:
    `resilience.launch.nodes`); member ``i`` gets namespace ``<prefix>-<member><i>`` and address
    10.213.0.<i + 1>."""

    def __init__(self, world_size: int, prefix: str | None = None, member: str = "r"):
        if member not in ("r", "n"):
            raise ValueError(f"member must be 'r' (ranks) or 'n' (nodes), not {member!r}")
        self.prefix = prefix or f"resilience-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.prefix}-sw"
        self.ranks = [{"rank": r, "namespace": f"{self.prefix}-{member}{r}", "ifname": IFNAME, "port": f"p{r}",
                       "address": f"{SUBNET}.{r + 1}"} for r in range(world_size)]

    def names(self) -> list[str]:
        return [self.switch] + [r["namespace"] for r in self.ranks]

    def existing(self) -> list[str]:
        return [name for name in list_namespaces() if name.startswith(self.prefix + "-")]

    def create(self) -> None:
        for name in self.names():  # before they exist: a harness killed half-way leaves none either
            janitor.register("netns", name)
        root = [f"netns add {name}" for name in self.names()]
        root += [f"link add {IFNAME} netns {r['namespace']} type veth peer name {r['port']} netns {self.switch}"
                 for r in self.ranks]
        run_command(["ip", "-batch", "-"], "\n".join(root) + "\n")
        switch = [f"link add {BRIDGE} type bridge", f"link set {BRIDGE} up"]
        for r in self.ranks:
            switch += [f"link set {r['port']} master {BRIDGE}", f"link set {r['port']} up"]
        run_command(["ip", "-n", self.switch, "-batch", "-"], "\n".join(switch) + "\n")
        for r in self.ranks:
            run_command(["ip", "-n", r["namespace"], "-batch", "-"],
                        f"addr add {r['address']}/24 dev {IFNAME}\nlink set {IFNAME} up\nlink set lo up\n")

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes each rank's veth received and sent so far."""
        found = {}
        for r in self.ranks:
            out = run_command(["ip", "-n", r["namespace"], "-s", "-j", "link", "show", "dev", IFNAME]).stdout
            stats = json.loads(out)[0]["stats64"]
            found[r["namespace"]] = {"rx_bytes": stats["rx"]["bytes"], "tx_bytes": stats["tx"]["bytes"]}
        return found

    def destroy(self) -> list[str]:
        """Delete every namespace of this case (their veths and bridge go with them); returns those
        still listed afterwards (none, unless the kernel refused)."""
        for name in self.existing():
            _delete_namespace(name)
        left = self.existing()
        for name in set(self.names()) - set(left):
            janitor.release("netns", name)
        return left


def namespace_inode(pid: int | str = "self") -> int | None:
    """The network namespace process ``pid`` is in (its inode); None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def is_in_namespace(name: str) -> bool:
    """Whether this process is in network namespace ``name`` (and that is not the machine's own)."""
    try:
        wanted = os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return False
    return namespace_inode() == wanted and namespace_inode(1) != wanted


def processes_in_my_namespace() -> list[int]:
    """Every other process in this process's network namespace (what ``ip netns pids`` lists)."""
    mine, me = namespace_inode(), os.getpid()
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and int(entry) != me and namespace_inode(entry) == mine]


def join_namespace(name: str) -> None:
    """Move the calling thread (the whole rank: it is single-threaded here) into network namespace ``name``."""
    path = NETNS_DIR / name
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if hasattr(os, "setns"):  # Python 3.12+
            os.setns(fd, CLONE_NEWNET)
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
    if os.stat("/proc/thread-self/ns/net").st_ino != os.stat(path).st_ino:
        raise OSError(f"setns({path}) returned, but this thread is not in that namespace")
