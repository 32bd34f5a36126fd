"""A node's DLRover agent, as far as checkpointing goes: ``python -m resilience.strategies.dlrover.agent``,
started by the harness once per node (`resilience.core.node_agents`) with DLRover layered over this
environment.

It does what ``dlrover-run``'s agent does for the flash checkpoint (dlrover 0.6.1,
``python/elastic_agent/torch/training.py``), without its job master:
  - at start, ``AsyncCheckpointSaver.start_async_saving_ckpt()`` (training.py:1126): the saver
    factory that the training processes' local rank 0 asks for a saver;
  - the workers failed (SIGUSR1): ``save_shm_to_storage(60, None)`` where ``save_at_breakpoint`` is
    on (``_save_ckpt_to_storage``, training.py:1345-1355, called at 1200-1201; off by default,
    training.py:217), then ``AsyncCheckpointSaver.reset()`` before the workers restart
    (``_restart_workers``, training.py:1383-1388);
  - the workers succeeded (SIGUSR2): ``while saver.wait_saving_checkpoint(): sleep`` before the
    agent exits (``_wait_async_saver``, training.py:1327-1343);
  - SIGTERM: ``saver.close()``, which unlinks the node's shared memory (ckpt_saver.py:564-576).
Each persist (``save_step_checkpoint``: the shards, their done files and, on node 0, the tracker;
ckpt_saver.py:925-990 and 1081-1150) is reported to a fault armed in the agent (`core.node_agents.persist`).
DLRover's host-wide names get the node's prefix: its sockets go under ``/dev/shm/<prefix>-sockets``
(the module global ``SOCKET_TMP_DIR``, hard-coded to ``/tmp/ckpt_sock/`` at
common/multi_process.py:32), and ``TORCHELASTIC_RUN_ID`` is the prefix, which names its
shared-memory segments (ckpt_saver.py:245-259) and its socket folder.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ...core.node_agents import DIR_ENV, NAME_ENV, NODE_ENV, OPTIONS_ENV, persist, serve
from . import dlrover_environment, use_node_sockets

POLL_S = 0.05
BREAKPOINT_TIMEOUT_S = 60  # as the agent passes it (training.py:1354)


def main() -> None:
    directory, name, node = Path(os.environ[DIR_ENV]), os.environ[NAME_ENV], int(os.environ[NODE_ENV])
    at_breakpoint = bool(json.loads(os.environ[OPTIONS_ENV]).get("save_at_breakpoint", False))
    os.environ.update(dlrover_environment(name, node))
    use_node_sockets(name)
    from dlrover.python.elastic_agent.torch import ckpt_saver
    from dlrover.python.elastic_agent.torch.ckpt_saver import AsyncCheckpointSaver

    for saver_class in (ckpt_saver.CommonDirCheckpointSaver, ckpt_saver.TempDirCheckpointSaver):
        report_persists(saver_class)

    def workers_failed() -> None:
        saver = AsyncCheckpointSaver.get_ckpt_saver()
        if saver is not None and at_breakpoint:
            saver.save_shm_to_storage(BREAKPOINT_TIMEOUT_S, None)
        AsyncCheckpointSaver.reset()

    def job_ended() -> None:
        saver = AsyncCheckpointSaver.get_ckpt_saver()
        while saver is not None and saver.wait_saving_checkpoint():
            time.sleep(POLL_S)

    AsyncCheckpointSaver.start_async_saving_ckpt()
    serve(directory, workers_failed, job_ended, POLL_S)
    saver = AsyncCheckpointSaver.get_ckpt_saver()
    if saver is not None:
        saver.close()
    sys.stdout.flush()
    os._exit(0)  # its saver threads are daemons blocked on sockets


def report_persists(saver_class) -> None:
    """Each ``save_step_checkpoint`` of ``saver_class`` (its own, not inherited) runs inside
    `core.node_agents.persist`."""
    save_step = saver_class.save_step_checkpoint

    def reported(self, step, *args, **kwargs):
        return persist(step, lambda: save_step(self, step, *args, **kwargs))

    saver_class.save_step_checkpoint = reported


if __name__ == "__main__":
    main()
