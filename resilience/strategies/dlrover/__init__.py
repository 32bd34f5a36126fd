"""DLRover's flash checkpoint as a system under test (``flash.py``), with the node agent that keeps
its saver alive across the ranks' restarts (``agent.py``).

DLRover's package needs ``grpcio`` at import (common/comm.py:18) without declaring it, and pulls
``pynvml``, which makes every ``import torch`` warn: every phase of a case on it runs with
``PACKAGES`` layered over this environment (`Case.software`), installed once without their
dependencies and cached; the node agents run with the same layers. The library is imported only
in those processes."""
from __future__ import annotations

from pathlib import Path

from ...core.node_agents import SHARED_MEMORY
from ..stack import Stack

#: dlrover and what its flash checkpoint imports that this environment lacks (checked by importing
#: the DDP checkpointer and the agent's saver at 0.6.1): grpc (common/comm.py:18) and deprecated.
#: Its pynvml is left out: nothing on this path imports it.
PACKAGES = ("dlrover==0.6.1", "grpcio==1.85.3", "Deprecated==1.3.1")
ROLE = "dlrover-trainer"  # the role under which the engine finds its agent's saver (engine.py:129)

STACK = Stack(
    name="dlrover",
    distributions=("dlrover",),
    requires="dlrover",  # never installed here: the fork server preloads nothing of it
)


def socket_dir(name: str) -> Path:
    """Where a node's DLRover processes meet (DLRover's own choice, /tmp/ckpt_sock/, is one per
    host): under the node's prefix, in /dev/shm so that the path stays short for AF_UNIX."""
    return SHARED_MEMORY / f"{name}-sockets"


def use_node_sockets(name: str) -> None:
    """Point DLRover's sockets at the node's own folder; before it creates any shared object, in
    the agent and in every rank."""
    import dlrover.python.common.multi_process as multi_process

    multi_process.SOCKET_TMP_DIR = f"{socket_dir(name)}/"


def dlrover_environment(name: str, node: int, nodes: int = 1, local_rank: int = 0,
                        local_world_size: int = 1) -> dict[str, str]:
    """The variables DLRover reads, as its launcher sets them (env_utils.py:25-56): the run id names
    the node's shared memory and sockets; ``GROUP_RANK`` defaults to 1 there, so it is always set."""
    return {"TORCHELASTIC_RUN_ID": name, "NODE_RANK": str(node), "GROUP_RANK": str(node),
            "GROUP_WORLD_SIZE": str(nodes), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size), "ROLE_NAME": ROLE}
