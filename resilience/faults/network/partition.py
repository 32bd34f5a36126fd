"""Real network faults between ranks (root): a partition (nftables drop rule) or a slow link (tbf).

``setup`` builds the case's network namespaces (see `netns`: one per rank, wired to a bridge in a
switch namespace) and ``teardown`` removes them whatever happened. Each rank joins its namespace in
``arm``, before ``torch.distributed`` starts, and sets ``GLOO_SOCKET_IFNAME=veth0``: the rendezvous
stays a FileStore, and every collective crosses the bridge. Restarted ranks run on loopback as usual.

At the trigger the rank reports the point and waits; ``supervise`` applies the impairment to that
rank's link, tells the rank (SIGUSR2) so the collective it enters next is already cut, and lifts it
``seconds`` later:

- ``partition``: an nftables table in the rank's namespace drops everything in and out of ``veth0``;
  with ``scope: node`` every rank the topology places on the trigger rank's node is cut off from the
  other nodes (``topology.node_of``), while the node's own ranks still reach each other, as over a
  machine's loopback.
  TCP retransmits what was lost with a doubling timeout (0.2 s, 0.4 s, 0.8 s, ...), so traffic resumes
  at the first retransmission after the rule goes: probed here, a 3 s partition delayed an all-reduce
  3.1 s. Longer than ``timeouts.collective``, the collective times out: loud.
- ``throttle``: a tbf qdisc limits both directions of the rank's link to ``rate_kbit`` (the kernel
  here has no netem, so no delay or loss emulation): a collective slower than the timeout is loud too.

The case directory gets ``network.json``: the namespaces and addresses (which the ranks read), when
the impairment was applied and lifted, and the bytes each rank's veth carried (read before teardown).

Under torchrun with the nodes as network namespaces (`resilience.launch.nodes`, the driver's
RESILIENCE_NODE_NAMESPACE set) the network is the nodes' own: no namespace per rank is built, the
ranks stay in their node's, and only ``scope: node`` is possible (a rule per namespace cuts a node,
not one of its ranks). Each node's driver calls ``supervise`` with handles to its own ranks only;
the driver of the trigger rank's node applies the rule in its node's namespace (the node's ranks
still reach each other over its own address, which the kernel routes through loopback) and
records ``network.node<N>.json``.

On a user's own script under torchrun (black-box mode) the ranks join their namespaces from the
startup hook, before the script imports ``torch.distributed``; its ``init_process_group()`` reads
the launcher's ``MASTER_ADDR``, which then names rank 0's namespace address: rank 0 hosts the
group's store there (torchrun's store per round, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), so the
rendezvous crosses the bridge with the collectives. The torchrun agent stays on the machine's own
network, and ranks it restarts run on loopback.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from typing import Any, ClassVar

from ...core.elastic_layout import NODE_ENV, NODE_NAMESPACE_ENV
from ...core.events import ClockPhase, Event
from ...errors import NetworkError
from ..base import CaseEnvironment, Fault, FaultUnavailable, RankEnvironment
from .netns import BRIDGE, IFNAME, SUBNET, NamespaceWiring, join_namespace, remove_stale_namespaces, run_command

__all__ = ["NamespaceWiring", "NetworkError", "NetworkFault", "Partition", "Throttle"]

RECORD = "network.json"
ACK = signal.SIGUSR2  # harness -> trigger rank: the impairment is in place
ACK_TIMEOUT_S = 60.0
NFT_TABLE = "resilience_partition"


class NetworkFault(Fault):
    """The namespaces, the trigger handshake and the timing; subclasses say what is done to the link."""

    points: ClassVar[dict[str, tuple[str, ...]]] = {"train": ("start",), "save": ("start",)}
    byte_points = ()
    supervises = True
    supervises_by_signals = True  # besides the rules, only the ack to the trigger rank reaches a rank
    joins_rank_namespaces = True
    #: commands a subclass needs besides ``ip``, with the package that provides them
    tools: ClassVar[dict[str, str]] = {}

    def __init__(self, spec):
        super().__init__(spec)
        self.wiring: NamespaceWiring | None = None
        self.record: dict[str, Any] = {}
        self.applied_at: float | None = None
        self.lifted_at: float | None = None
        self.impaired: tuple[int, ...] = ()  # the ranks whose links the fault cuts or slows
        self.node_link: dict | None = None  # under torchrun on nodes: this driver's node's namespace

    # -- harness side -------------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this machine cannot inject the fault, naming what to install; None when it can.
        It is the skip reason of the case, so it says the command that fixes it."""
        if os.geteuid() != 0:
            return f"{cls.kind} puts ranks in network namespaces, which needs root"
        missing = {tool: package for tool, package in {"ip": "iproute2", **cls.tools}.items()
                   if shutil.which(tool) is None}
        if not missing:
            return None
        packages = " ".join(sorted(set(missing.values())))
        commands = ", ".join(f"`{tool}`" for tool in missing)
        return f"{cls.kind} needs {commands}, not found on PATH: apt-get install {packages} (as root)"

    def setup(self, env: CaseEnvironment) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise FaultUnavailable(reason)
        if os.environ.get(NODE_NAMESPACE_ENV):  # a node's driver: the network is the nodes'
            self.node_link = {"namespace": os.environ[NODE_NAMESPACE_ENV], "ifname": IFNAME}
            self.record = {"kind": self.kind, "node": os.environ.get(NODE_ENV), **self.node_link}
            return
        stale = remove_stale_namespaces()
        world = env.world_size
        self.wiring = NamespaceWiring(world)
        self.impaired = (self.trigger.rank,)
        if self.spec.params.get("scope") == "node":  # a script has no placement: refused at load
            placement = env.case.placement
            node = placement.node_of(self.trigger.rank)
            self.impaired = tuple(r for r in range(world) if placement.node_of(r) == node)
        try:
            self.wiring.create()
            self.probe()
        except NetworkError as exc:  # e.g. no CAP_NET_ADMIN in a container, no bridge or tbf in the kernel
            raise FaultUnavailable(f"{self.kind}: cannot build the rank network here: {exc}") from None
        self.record = {"kind": self.kind, "switch": self.wiring.switch, "ranks": self.wiring.ranks,
                       "subnet": f"{SUBNET}.0/24", "stale_removed": stale, "impaired": list(self.impaired)}
        self._write(env)

    def probe(self) -> None:
        """Apply and lift the impairment once on the switch's bridge: a kernel or tool that cannot
        do it makes the case unavailable before any rank starts, not a harness error half-way."""

    def supervise(self, events: list[dict], ranks: list) -> None:
        if self.applied_at is None:
            if any(e["event"] == Event.FAULT_FIRED and e["rank"] == self.trigger.rank for e in events):
                if self.node_link is not None and not ranks[self.trigger.rank].is_ours:
                    return  # another node's driver cuts that node off
                for link in self._links():
                    self.apply(link)
                self.applied_at = time.time()
                ranks[self.trigger.rank].signal(ACK)
        elif self.lifted_at is None and time.time() >= self.applied_at + self.spec.params["seconds"]:
            self._lift_all()

    def heal(self, env: CaseEnvironment) -> None:
        if self.applied_at is not None and self.lifted_at is None:  # the first run ended first
            self._lift_all()
        if self.wiring is None and self.node_link is None:
            return
        self.record.update(applied_at=self.applied_at, lifted_at=self.lifted_at,
                           counters=self.wiring.counters() if self.wiring else None)
        self._write(env)

    def teardown(self, env: CaseEnvironment) -> None:
        if self.node_link is not None:
            self.heal(env)  # under torchrun the first run's end is not the driver's to see: lift now at the latest
        if self.wiring is None:
            return
        left = self.wiring.destroy()
        self.record.update(removed=not left)
        self._write(env)
        if left:
            raise NetworkError(f"network namespaces left behind after teardown: {', '.join(left)}")

    def notes(self, env: CaseEnvironment, phases) -> tuple[str, ...]:
        if self.node_link is None or self.applied_at is None:
            return ()
        lifted = f"lifted {self.lifted_at - self.applied_at:.1f} s later" if self.lifted_at else "never lifted"
        return (f"node {self.record['node']} cut off the other nodes by its driver ({self.kind} of "
                f"{self.node_link['namespace']}'s {IFNAME}), {lifted}",)

    def _links(self) -> list[dict]:
        """The links the impairment acts on: the impaired ranks', or the node's one."""
        return [self.node_link] if self.node_link is not None else [self.wiring.ranks[r] for r in self.impaired]

    def _lift_all(self) -> None:
        for link in self._links():
            self.lift(link)
        self.lifted_at = time.time()

    def _write(self, env: CaseEnvironment) -> None:
        name = RECORD if self.node_link is None else f"network.node{self.record['node']}.json"
        (env.case_dir / name).write_text(json.dumps(self.record, indent=1))

    def apply(self, link: dict) -> None:
        raise NotImplementedError

    def lift(self, link: dict) -> None:
        raise NotImplementedError

    # -- rank side ----------------------------------------------------------------------------
    def arm(self, env: RankEnvironment) -> None:
        super().arm(env)
        if os.environ.get(NODE_NAMESPACE_ENV):  # already in its node's namespace, on its node's link
            signal.pthread_sigmask(signal.SIG_BLOCK, {ACK})
            return
        if env.case_dir is None or not (env.case_dir / RECORD).exists():
            raise RuntimeError(f"{self.kind}: no {RECORD} from the harness side (was setup skipped?)")
        wiring = json.loads((env.case_dir / RECORD).read_text())["ranks"]
        me = wiring[env.rank]
        # blocked from now on, in every thread started later too: the harness's ack stays pending
        # until `at` takes it, instead of ending the process (SIGUSR2's default action)
        signal.pthread_sigmask(signal.SIG_BLOCK, {ACK})
        join_namespace(me["namespace"])
        os.environ["GLOO_SOCKET_IFNAME"] = me["ifname"]  # read when the process group is created
        if "MASTER_ADDR" in os.environ:  # a launcher's env:// rendezvous: rank 0 serves it in its namespace
            os.environ["MASTER_ADDR"] = wiring[0]["address"]
        env.emit(Event.NETWORK_JOINED, namespace=me["namespace"], ifname=me["ifname"], address=me["address"])

    def at(self, phase: ClockPhase, step: int) -> None:
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
    leaves_saves_alone = True
    params: ClassVar[dict] = {"seconds": (float, None), "scope": (("rank", "node"), "rank")}
    tools: ClassVar[dict[str, str]] = {"nft": "nftables"}
    node_scoped: ClassVar[bool] = True  # scope node under torchrun on several nodes (see the module's docstring)
    needs_node_namespace: ClassVar[bool] = True  # ... whose nodes are network namespaces

    @staticmethod
    def rules(spared: tuple[str, ...] = ()) -> str:
        """The nftables table: drop everything through the link but traffic with ``spared`` addresses."""
        keep = (f"ip saddr != {{ {', '.join(spared)} }} ", f"ip daddr != {{ {', '.join(spared)} }} ") if spared \
            else ("", "")
        return (f"table inet {NFT_TABLE} {{\n"
                f"  chain input {{ type filter hook input priority filter; policy accept; "
                f"iifname \"{IFNAME}\" {keep[0]}drop; }}\n"
                f"  chain output {{ type filter hook output priority filter; policy accept; "
                f"oifname \"{IFNAME}\" {keep[1]}drop; }}\n"
                "}\n")

    def probe(self) -> None:
        run_command(["ip", "netns", "exec", self.wiring.switch, "nft", "-f", "-"], self.rules(("10.0.0.1",)))
        run_command(["ip", "netns", "exec", self.wiring.switch, "nft", "delete", "table", "inet", NFT_TABLE])

    def apply(self, link: dict) -> None:
        # a node's ranks keep talking to each other (one machine); only other nodes are cut off
        mates = tuple(self.wiring.ranks[rank]["address"] for rank in self.impaired
                      if self.wiring.ranks[rank] is not link) if len(self.impaired) > 1 and self.wiring else ()
        run_command(["ip", "netns", "exec", link["namespace"], "nft", "-f", "-"], self.rules(mates))

    def lift(self, link: dict) -> None:
        run_command(["ip", "netns", "exec", link["namespace"], "nft", "delete", "table", "inet", NFT_TABLE])


class Throttle(NetworkFault):
    """Both directions of ``rank``'s link limited to ``rate_kbit`` kbit/s for ``seconds`` (tbf)."""

    kind = "throttle"
    leaves_saves_alone = True
    params: ClassVar[dict] = {"seconds": (float, None), "rate_kbit": (float, None)}
    tools: ClassVar[dict[str, str]] = {"tc": "iproute2"}

    def _tbf(self) -> list[str]:
        rate = self.spec.params["rate_kbit"]
        burst = max(4096, int(rate * 1000 / 8 / 100))  # 10 ms at the rate, and at least a few packets
        return ["tbf", "rate", f"{rate:g}kbit", "burst", str(burst), "latency", "1s"]

    def _ends(self, link: dict) -> list[tuple[str, str]]:
        return [(link["namespace"], link["ifname"]), (self.wiring.switch, link["port"])]

    def probe(self) -> None:
        run_command(["tc", "-n", self.wiring.switch, "qdisc", "add", "dev", BRIDGE, "root"] + self._tbf())
        run_command(["tc", "-n", self.wiring.switch, "qdisc", "del", "dev", BRIDGE, "root"])

    def apply(self, link: dict) -> None:
        for namespace, device in self._ends(link):
            run_command(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root"] + self._tbf())

    def lift(self, link: dict) -> None:
        for namespace, device in self._ends(link):
            run_command(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"])

    def describe(self) -> dict[str, Any]:
        return {"seconds": self.spec.params["seconds"], "rate_kbit": self.spec.params["rate_kbit"]}
