"""Real network faults between ranks (root): a partition (nftables drop rule) or a slow link (tbf).

Topology, built by ``setup`` and removed by ``teardown`` whatever happened: every rank of the first
run gets a network namespace of its own holding ``veth0`` with 10.213.0.<rank + 1>/24; the other end of
each veth pair, ``p<rank>``, is a port of the bridge ``br0`` in a switch namespace of the case's own.
Nothing is added to the host's namespace: concurrent cases use the same private addresses without
seeing each other, and interface names (at most IFNAMSIZ - 1 = 15 bytes) only have to be unique
inside their namespace. Namespace names carry the harness's pid and a random token
(``resilience-<pid>-<token>-r0``); ``setup`` removes those left behind by a harness that no longer
exists (one killed before its teardown could run).

Each rank joins its namespace in ``arm``, before ``torch.distributed`` starts (``setns`` on
/run/netns/NAME: Python 3.11 has no ``os.setns``, so through libc; a forked rank is single-threaded and
gloo's threads, started later, inherit the namespace), and sets ``GLOO_SOCKET_IFNAME=veth0``: the
rendezvous stays a FileStore, and every collective crosses the bridge. Restarted ranks run on
loopback as usual.

At the trigger the rank reports the point and waits; ``supervise`` applies the impairment to that
rank's link, tells the rank (SIGUSR2) so the collective it enters next is already cut, and lifts it
``seconds`` later:

- ``partition``: an nftables table in the rank's namespace drops everything in and out of ``veth0``.
  TCP retransmits what was lost with a doubling timeout (0.2 s, 0.4 s, 0.8 s, ...), so traffic resumes
  at the first retransmission after the rule goes: probed here, a 3 s partition delayed an all-reduce
  3.1 s. Longer than ``timeouts.collective``, the collective times out: loud.
- ``throttle``: a tbf qdisc limits both directions of the rank's link to ``rate_kbit`` (the kernel
  here has no netem, so no delay or loss emulation): a collective slower than the timeout is loud too.

The case directory gets ``network.json``: the namespaces and addresses (which the ranks read), when
the impairment was applied and lifted, and the bytes each rank's veth carried (read before teardown).
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar

from ..core import janitor
from ..errors import HarnessError, NetworkError
from .base import CaseEnvironment, Fault, FaultUnavailable, RankEnvironment

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
SUBNET = "10.213.0"  # private (RFC 1918), and only ever inside the case's own namespaces
IFNAME = "veth0"  # the rank's interface, inside its namespace
BRIDGE = "br0"
RECORD = "network.json"
ACK = signal.SIGUSR2  # harness -> trigger rank: the impairment is in place
ACK_TIMEOUT_S = 60.0
COMMAND_TIMEOUT_S = 30.0
NFT_TABLE = "resilience_partition"
NAME = re.compile(r"^resilience-(?P<pid>\d+)-(?P<token>[0-9a-f]{6})-(?:sw|r\d+)$")


def _run(argv: list[str], input_text: str | None = None) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(argv, input=input_text, check=False, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_stale_namespaces() -> list[str]:
    """Namespaces of harnesses that died before their teardown: removed, and returned."""
    stale = [name for name in list_namespaces()
             if (match := NAME.match(name)) and not _alive(int(match.group("pid")))]
    for name in stale:
        subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True, timeout=COMMAND_TIMEOUT_S)
    return stale


class Topology:
    """One case's namespaces: a switch with a bridge, and one namespace per rank wired to it."""

    def __init__(self, world_size: int, prefix: str | None = None):
        self.prefix = prefix or f"resilience-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.prefix}-sw"
        self.ranks = [{"rank": r, "namespace": f"{self.prefix}-r{r}", "ifname": IFNAME, "port": f"p{r}",
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
        _run(["ip", "-batch", "-"], "\n".join(root) + "\n")
        switch = [f"link add {BRIDGE} type bridge", f"link set {BRIDGE} up"]
        for r in self.ranks:
            switch += [f"link set {r['port']} master {BRIDGE}", f"link set {r['port']} up"]
        _run(["ip", "-n", self.switch, "-batch", "-"], "\n".join(switch) + "\n")
        for r in self.ranks:
            _run(["ip", "-n", r["namespace"], "-batch", "-"],
                 f"addr add {r['address']}/24 dev {IFNAME}\nlink set {IFNAME} up\nlink set lo up\n")

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes each rank's veth received and sent so far."""
        found = {}
        for r in self.ranks:
            out = _run(["ip", "-n", r["namespace"], "-s", "-j", "link", "show", "dev", IFNAME]).stdout
            stats = json.loads(out)[0]["stats64"]
            found[r["namespace"]] = {"rx_bytes": stats["rx"]["bytes"], "tx_bytes": stats["tx"]["bytes"]}
        return found

    def destroy(self) -> list[str]:
        """Delete every namespace of this case (their veths and bridge go with them); returns those
        still listed afterwards (none, unless the kernel refused)."""
        for name in self.existing():
            subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True, timeout=COMMAND_TIMEOUT_S)
        left = self.existing()
        for name in set(self.names()) - set(left):
            janitor.release("netns", name)
        return left


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


class NetworkFault(Fault):
    """The namespaces, the trigger handshake and the timing; subclasses say what is done to the link."""

    points: ClassVar[dict[str, tuple[str, ...]]] = {"train": ("start",), "save": ("start",)}
    byte_points = ()
    supervises = True
    #: commands a subclass needs besides ``ip``, with the package that provides them
    tools: ClassVar[dict[str, str]] = {}

    def __init__(self, spec):
        super().__init__(spec)
        self.topology: Topology | None = None
        self.record: dict[str, Any] = {}
        self.applied_at: float | None = None
        self.lifted_at: float | None = None

    # -- harness side -------------------------------------------------------------------------
    def setup(self, env: CaseEnvironment) -> None:
        if os.geteuid() != 0:
            raise FaultUnavailable(f"{self.kind} puts ranks in network namespaces, which needs root")
        for tool, package in {"ip": "iproute2", **self.tools}.items():
            if shutil.which(tool) is None:
                raise FaultUnavailable(f"{self.kind} needs `{tool}` (install {package})")
        stale = remove_stale_namespaces()
        self.topology = Topology(env.case.workload.world_size)
        try:
            self.topology.create()
            self.probe()
        except NetworkError as exc:  # e.g. no CAP_NET_ADMIN in a container, no bridge or tbf in the kernel
            raise FaultUnavailable(f"{self.kind}: cannot build the rank network here: {exc}") from None
        self.record = {"kind": self.kind, "switch": self.topology.switch, "ranks": self.topology.ranks,
                       "subnet": f"{SUBNET}.0/24", "stale_removed": stale}
        self._write(env)

    def probe(self) -> None:
        """Apply and lift the impairment once on the switch's bridge: a kernel or tool that cannot
        do it makes the case unavailable before any rank starts, not a harness error half-way."""

    def supervise(self, events: list[dict], ranks: list) -> None:
        if self.applied_at is None:
            if any(e["event"] == "fault_fired" and e["rank"] == self.trigger.rank for e in events):
                self.apply(self.topology.ranks[self.trigger.rank])
                self.applied_at = time.time()
                ranks[self.trigger.rank].signal(ACK)
        elif self.lifted_at is None and time.time() >= self.applied_at + self.spec.params["seconds"]:
            self.lift(self.topology.ranks[self.trigger.rank])
            self.lifted_at = time.time()

    def heal(self, env: CaseEnvironment) -> None:
        if self.topology is None:
            return
        if self.applied_at is not None and self.lifted_at is None:  # the first run ended first
            self.lift(self.topology.ranks[self.trigger.rank])
            self.lifted_at = time.time()
        self.record.update(applied_at=self.applied_at, lifted_at=self.lifted_at, counters=self.topology.counters())
        self._write(env)

    def teardown(self, env: CaseEnvironment) -> None:
        if self.topology is None:
            return
        left = self.topology.destroy()
        self.record.update(removed=not left)
        self._write(env)
        if left:
            raise NetworkError(f"network namespaces left behind after teardown: {', '.join(left)}")

    def _write(self, env: CaseEnvironment) -> None:
        (env.case_dir / RECORD).write_text(json.dumps(self.record, indent=1))

    def apply(self, link: dict) -> None:
        raise NotImplementedError

    def lift(self, link: dict) -> None:
        raise NotImplementedError

    # -- rank side ----------------------------------------------------------------------------
    def arm(self, env: RankEnvironment) -> None:
        super().arm(env)
        if env.case_dir is None or not (env.case_dir / RECORD).exists():
            raise RuntimeError(f"{self.kind}: no {RECORD} from the harness side (was setup skipped?)")
        me = json.loads((env.case_dir / RECORD).read_text())["ranks"][env.rank]
        # blocked from now on, in every thread started later too: the harness's ack stays pending
        # until `at` takes it, instead of ending the process (SIGUSR2's default action)
        signal.pthread_sigmask(signal.SIG_BLOCK, {ACK})
        join_namespace(me["namespace"])
        os.environ["GLOO_SOCKET_IFNAME"] = me["ifname"]  # read when the process group is created
        env.emit("network_joined", namespace=me["namespace"], ifname=me["ifname"], address=me["address"])

    def at(self, phase: str, step: int) -> None:
        if not self.in_trigger_window():
            return
        self.fired(point="start", **self.describe())
        if signal.sigtimedwait({ACK}, ACK_TIMEOUT_S) is None:
            raise RuntimeError(f"{self.kind}: the harness did not report the impairment in place within "
                               f"{ACK_TIMEOUT_S:g} s of the trigger")

    def describe(self) -> dict[str, Any]:
        return {"seconds": self.spec.params["seconds"]}


class Partition(NetworkFault):
    """Every packet in and out of ``rank``'s link dropped for ``seconds`` (nftables)."""

    kind = "partition"
    params: ClassVar[dict] = {"seconds": (float, None)}
    tools: ClassVar[dict[str, str]] = {"nft": "nftables"}

    RULES = (f"table inet {NFT_TABLE} {{\n"
             f"  chain input {{ type filter hook input priority filter; policy accept; iifname \"{IFNAME}\" drop; }}\n"
             f"  chain output {{ type filter hook output priority filter; policy accept; oifname \"{IFNAME}\" drop; }}\n"
             "}\n")

    def probe(self) -> None:
        _run(["ip", "netns", "exec", self.topology.switch, "nft", "-f", "-"], self.RULES)
        _run(["ip", "netns", "exec", self.topology.switch, "nft", "delete", "table", "inet", NFT_TABLE])

    def apply(self, link: dict) -> None:
        _run(["ip", "netns", "exec", link["namespace"], "nft", "-f", "-"], self.RULES)

    def lift(self, link: dict) -> None:
        _run(["ip", "netns", "exec", link["namespace"], "nft", "delete", "table", "inet", NFT_TABLE])


class Throttle(NetworkFault):
    """Both directions of ``rank``'s link limited to ``rate_kbit`` kbit/s for ``seconds`` (tbf)."""

    kind = "throttle"
    params: ClassVar[dict] = {"seconds": (float, None), "rate_kbit": (float, None)}
    tools: ClassVar[dict[str, str]] = {"tc": "iproute2"}

    def _tbf(self) -> list[str]:
        rate = self.spec.params["rate_kbit"]
        burst = max(4096, int(rate * 1000 / 8 / 100))  # 10 ms at the rate, and at least a few packets
        return ["tbf", "rate", f"{rate:g}kbit", "burst", str(burst), "latency", "1s"]

    def _ends(self, link: dict) -> list[tuple[str, str]]:
        return [(link["namespace"], link["ifname"]), (self.topology.switch, link["port"])]

    def probe(self) -> None:
        _run(["tc", "-n", self.topology.switch, "qdisc", "add", "dev", BRIDGE, "root"] + self._tbf())
        _run(["tc", "-n", self.topology.switch, "qdisc", "del", "dev", BRIDGE, "root"])

    def apply(self, link: dict) -> None:
        for namespace, device in self._ends(link):
            _run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root"] + self._tbf())

    def lift(self, link: dict) -> None:
        for namespace, device in self._ends(link):
            _run(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"])

    def describe(self) -> dict[str, Any]:
        return {"seconds": self.spec.params["seconds"], "rate_kbit": self.spec.params["rate_kbit"]}
