"""The torchrun command line of a case (how many nodes and ranks, which rendezvous, the entry point
every rank runs: `resilience.rank.elastic_entry`), and which cases torchrun can express."""
from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core import registry
from ..core.case import Case
from ..core.elastic_layout import NODE_NAMESPACE_ENV
from ..faults.base import Fault

STARTUP_S = 120.0  # torchrun's start, rendezvous and `import torch` on busy machines
STANDBY_S = 1800.0
ENTRY_MODULE = "resilience.rank.elastic_entry"


@dataclass(frozen=True)
class TorchrunOptions:
    """How torchrun is launched. ``rdzv_endpoint`` None with one node: ``--standalone``."""

    nnodes: int = 1
    nproc_per_node: int | None = None  # None: the case's world size divided by nnodes
    max_restarts: int = 1
    rdzv_endpoint: str | None = None  # HOST:PORT of the c10d rendezvous (several nodes)
    rdzv_id: str | None = None  # None: derived from the case directory (the same on every node)
    python: str = sys.executable
    startup_s: float = STARTUP_S
    #: ``--rdzv-conf``: "is_host=1" on the node that serves the c10d store when the endpoint is not
    #: one of gethostname()'s addresses (nodes in namespaces), and the rendezvous timeouts
    rdzv_conf: str | None = None
    local_addr: str | None = None  # ``--local-addr``: this node's address (rank order follows it)
    min_nodes: int | None = None  # elastic: ``--nnodes MIN:MAX`` with MAX = nnodes
    join: bool = False  # the case directory is already being run by other nodes (a spare joining)
    #: a spare standing by: its agent is started (`resilience.launch.standby_agent`) and runs torchrun
    #: once this file exists (the moment the scheduler hands the node to the job), at most STANDBY_S later
    standby: Path | None = None

    def ranks_per_node(self, case: Case) -> int:
        return self.nproc_per_node if self.nproc_per_node is not None else case.workload.world_size // self.nnodes


def torchrun_command(case: Case, options: TorchrunOptions, case_dir: Path, launch: int = 0) -> list[str]:
    """The torchrun command line of one launch (the same on every node)."""
    if options.nnodes == 1 and not options.rdzv_endpoint:
        rendezvous = ["--standalone"]
    else:
        rdzv_id = options.rdzv_id or "resilience-" + hashlib.sha256(str(case_dir).encode()).hexdigest()[:12]
        rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", options.rdzv_endpoint,
                      "--rdzv-id", f"{rdzv_id}-{launch}"]
        rendezvous += ["--rdzv-conf", options.rdzv_conf] if options.rdzv_conf else []
        rendezvous += ["--local-addr", options.local_addr] if options.local_addr else []
    nnodes = f"{options.min_nodes}:{options.nnodes}" if options.min_nodes else str(options.nnodes)
    # a spare standing by: its agent process starts now, warm, and runs torchrun once handed over
    agent = (["resilience.launch.standby_agent", str(options.standby), f"{STANDBY_S:g}"] if options.standby
             else ["torch.distributed.run"])
    return [options.python, "-m", *agent, *rendezvous, "--nnodes", nnodes,
            "--nproc-per-node", str(options.ranks_per_node(case)), "--max-restarts", str(options.max_restarts),
            "--monitor-interval", "0.1", "-m", ENTRY_MODULE, str(case_dir)]




def incompatibility(case: Case, options: TorchrunOptions = TorchrunOptions()) -> str | None:
    """Why the case cannot run as one torchrun job, or None. The agent restarts a group at the size
    and rank layout it had, with the interpreter it was started with, and nothing outside the
    ranks acts on them while they run."""
    where = f"{case.source}[{case.id}]"
    if options.nnodes < 1 or options.max_restarts < 0:
        return f"{where}: nnodes must be >= 1 and max_restarts >= 0; got {options.nnodes}, {options.max_restarts}"
    per_node = options.ranks_per_node(case)
    if per_node < 1 or options.nnodes * per_node != case.workload.world_size:
        return (f"{where}: workload.world_size is {case.workload.world_size}, but nnodes {options.nnodes} x "
                f"nproc_per_node {per_node} = {options.nnodes * per_node}; allowed: a product equal to it")
    if options.nnodes > 1 and not options.rdzv_endpoint:
        return f"{where}: {options.nnodes} nodes need rdzv_endpoint HOST:PORT (the c10d rendezvous)"
    elastic = options.min_nodes is not None and case.restart.world_size % per_node == 0 and (
        options.min_nodes <= case.restart.world_size // per_node <= options.nnodes)
    if case.topology_changes and not elastic:
        return (f"{where}: restart.world_size is {case.restart.world_size}, the first run's "
                f"{case.workload.world_size}; torchrun's agent restarts a group at the size it had "
                f"(allowed: restart.world_size {case.workload.world_size}, or with --nnodes MIN:MAX a multiple "
                f"of {per_node} ranks per node between MIN and MAX nodes; or run this case with the local harness)")
    if case.timeline:
        return (f"{where}: a timeline of {len(case.timeline) + 1} launches, each with a fault of its own, runs "
                f"under the local harness only; torchrun's agent restarts the group with the first run's fault "
                f"(allowed: fault and restart, or run this case with the local harness)")
    if case.restart.rank_map != tuple(range(case.restart.world_size)):
        return (f"{where}: restart.rank_map is {list(case.restart.rank_map)}; torchrun assigns ranks itself "
                f"(allowed: identity)")
    if case.software:
        return (f"{where}: software {case.software.as_dict()} runs every phase under other software; this "
                f"driver starts torchrun with its own interpreter (allowed: no software, or run this case "
                f"with the local harness)")
    if case.restart.python or case.restart.packages:
        return (f"{where}: the restart runs under another interpreter or packages; torchrun restarts "
                f"with the one it was started with (allowed: neither restart.python nor restart.packages)")
    fault = registry.resolve("fault", case.fault.kind)
    if fault.acts_in_its_node and options.nnodes == 1:
        return (f"{where}: fault {case.fault.kind} ends a whole node; under torchrun that needs several nodes "
                f"(allowed: nnodes >= 2, each node a network namespace: resilience.launch.nodes)")
    node_wide = fault.node_scoped and case.fault.params.get("scope") == "node"
    if node_wide and options.nnodes == 1:
        return (f"{where}: fault {case.fault.kind} with scope node is driven by the driver of the trigger's node; "
                f"under torchrun that needs several nodes (allowed: nnodes >= 2, each node a network namespace: "
                f"resilience.launch.nodes)")
    if node_wide and fault.needs_node_namespace and not os.environ.get(NODE_NAMESPACE_ENV):
        return (f"{where}: fault {case.fault.kind} with scope node under torchrun is a rule in the node's own network "
                f"namespace, and this node is none ({NODE_NAMESPACE_ENV} unset): on a machine of its own it would cut "
                f"the machine's interface (allowed: the nodes as network namespaces, resilience.launch.nodes)")
    if fault.supervises and not fault.acts_in_its_node and not node_wide:
        return (f"{where}: fault {case.fault.kind} is driven from outside the ranks while they run "
                f"(signals, network rules); under torchrun faults act only from inside the ranks, "
                f"or with several nodes a stall or partition of scope node (its node's driver drives it)")
    if fault.heal is not Fault.heal and not node_wide:
        return (f"{where}: fault {case.fault.kind} is repaired or released between the first run and the restart "
                f"(heal), a moment torchrun's agent does not offer")
    return None
