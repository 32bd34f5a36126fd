"""The torchrun command line of a case: how many nodes and ranks, which rendezvous, and the entry
point every rank runs (`resilience.rank.elastic_entry`)."""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.case import Case

STARTUP_S = 120.0  # torchrun's start, rendezvous and `import torch` on busy machines
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
    return [options.python, "-m", "torch.distributed.run", *rendezvous, "--nnodes", nnodes,
            "--nproc-per-node", str(options.ranks_per_node(case)), "--max-restarts", str(options.max_restarts),
            "--monitor-interval", "0.1", "-m", ENTRY_MODULE, str(case_dir)]


