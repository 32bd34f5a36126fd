"""One rank's collectives fail at a chosen step and phase, the in-process failure fault-tolerant
trainers inject (torchft fails an all-reduce; NVRx raises into the job).

``ProcessGroup.abort()`` is no such failure on gloo in torch 2.13: it returns, and the next
all-reduce on both ranks succeeds (pytorch/pytorch#130345; tests/test_collective_failure.py shows
it). So the fault fails the collective below the process group, or at its entry:

- ``how: transport`` (default): every established TCP connection of the rank (gloo's pairs to its
  peers; the rendezvous is a FileStore and holds none) is shut down with ``shutdown(SHUT_RDWR)``: the kernel
  ends the streams, and gloo on both sides meets a closed connection in its next collective;
- ``how: raise``: the rank's next ``all_reduce`` or ``barrier`` call raises
  `resilience.errors.InjectedCollectiveFailure` before entering gloo, as a wrapper that injects an
  all-reduce failure does: its peers are left waiting in that collective until their timeout.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from ...core.events import ClockPhase
from ...errors import InjectedCollectiveFailure
from ..base import Fault

HOWS = ("transport", "raise")
WRAPPED = ("all_reduce", "barrier")


ESTABLISHED = "01"  # the st column of /proc/net/tcp


def tcp_socket_fds() -> list[int]:
    """The file descriptors of this process's established TCP connections (from /proc: inode -> fd).
    Listening sockets are left alone: a network failure ends connections, and gloo's listener thread
    aborts the process when its socket is shut down (``accept: Invalid argument``, torch 2.13)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        inodes.update(fields[9] for fields in map(str.split, lines) if len(fields) > 9 and fields[3] == ESTABLISHED)
    found = []
    for entry in os.scandir("/proc/self/fd"):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            found.append(int(entry.name))
    return found


def shut_down_transport() -> int:
    """Shut down every TCP socket of this process; how many there were."""
    count = 0
    for fd in tcp_socket_fds():
        try:
            duplicate = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            duplicate.shutdown(socket.SHUT_RDWR)  # acts on the socket itself, not on this descriptor
            count += 1
        except OSError:
            pass
        finally:
            duplicate.close()
    return count


class CollectiveFailure(Fault):
    """At ``start`` of the trigger's train step (before its gradient all-reduce) or save,
    ``rank``'s collectives fail ``how`` (module docstring)."""

    kind = "collective_failure"
    leaves_saves_alone = True
    points = {"train": ("start",), "save": ("start",)}
    byte_points = ()
    params = {"how": (HOWS, "transport")}

    def at(self, phase: ClockPhase, step: int) -> None:
        if not self.in_trigger_window():
            return
        how = self.spec.params.get("how", "transport")
        if how == "transport":
            self.fired(point="start", how=how, sockets=len(tcp_socket_fds()))
            shut_down_transport()
            return
        self.fired(point="start", how=how)
        self._raise_in_next_collective(phase, step)

    def _raise_in_next_collective(self, phase: str, step: int) -> None:
        import torch.distributed as dist

        originals = {name: getattr(dist, name) for name in WRAPPED}

        def failing(name):
            def call(*args, **kwargs):
                for original_name, original in originals.items():  # once: later calls are real again
                    setattr(dist, original_name, original)
                raise InjectedCollectiveFailure(f"collective_failure: {name} on rank {self.env.rank} failed "
                                                f"(injected at {phase} of step {step})")
            return call

        for name in WRAPPED:
            setattr(dist, name, failing(name))
