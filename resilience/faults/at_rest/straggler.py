"""Split brain: a process of the previous incarnation of the job still writes into the checkpoint
directory while the restarted job restores from it (a rank on a node the scheduler lost track
of, an upload or async-save worker that outlived its job).

After the ``step`` save returned on every rank, the trigger rank starts a real helper process in
its own session (so the kill of the rank's process group does not reach it) and dies, which stops
the first run as ``version_mismatch`` does. Once the first run has ended the harness releases the
helper and waits until its first write has landed, so the restart always begins with a straggler
at work (a helper still starting up on a loaded machine would otherwise miss the restore). From
then on the helper writes the stale file matching ``source`` (say this rank's file of the previous
checkpoint) over every file matching ``file`` written during the ``step`` save, every ``interval``
seconds, each time to a temporary name and renamed into place (a reader sees the whole stale file,
never a torn one). It stops after ``seconds`` on its own; the harness SIGKILLs it by pid at
teardown anyway.

    python -m resilience.faults.at_rest.straggler CONFIG_JSON    (started by the fault, never by hand)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from ...core.confined import resolve_under
from ...core.processes import is_running
from ...core.waiting import wait_until
from ...errors import HarnessError
from ..base import CaseEnvironment
from .damage import DamageAfterSave, file_identities

PIDS_FILE = "straggler.pids"  # in the case directory: one pid per line, for teardown
RELEASE_FILE = "straggler.release"  # made by the harness once the first run ended
FIRST_WRITE_FILE = "straggler.wrote"  # made by the helper once every target holds the stale file
MODULE = "resilience.faults.at_rest.straggler"
EXIT_WAIT_S = 10.0
FIRST_WRITE_WAIT_S = 120.0  # a cold interpreter on two loaded cores; the helper is waited for, never raced


class Straggler(DamageAfterSave):
    trace_targets = ()  # its writer process copies by glob
    kind = "straggler"
    params = {"source": (str, None), "seconds": (float, 20.0), "interval": (float, 0.2)}

    @classmethod
    def check(cls, spec):
        if not spec.params.get("source"):
            return ("fault.source", "missing: the glob of the stale file the straggler writes", None,
                    "a glob relative to the checkpoint directory, e.g. 'step_00000004/*_rank_1.pt'")
        return None

    def pick(self, changed: list[str]) -> list[str]:
        return [relative for relative in changed if not fnmatchcase(relative, self.spec.params["source"])]

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        root = self.env.checkpoint_dir
        sources = [r for r in file_identities(root) if fnmatchcase(r, self.spec.params["source"])]
        if len(sources) != 1:
            raise ValueError(f"fault.source {self.spec.params['source']!r} must match exactly one file under "
                             f"{root}; it matched {sources}")
        case_dir = self.env.case_dir
        config = {"source": str(resolve_under(root, sources[0])), "targets": [str(p) for p in paths],
                  "wait_for": str(case_dir / RELEASE_FILE), "wrote": str(case_dir / FIRST_WRITE_FILE),
                  "wait_s": FIRST_WRITE_WAIT_S, "seconds": self.spec.params["seconds"],
                  "interval": self.spec.params["interval"]}
        from ...core.paths import PROJECT_ROOT

        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]))
        helper = subprocess.Popen([sys.executable, "-m", MODULE, json.dumps(config)], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        with open(case_dir / PIDS_FILE, "a") as pids:
            pids.write(f"{helper.pid}\n")
        return {"source": sources[0], "straggler_pid": helper.pid}

    # -- harness side ---------------------------------------------------------------------------
    def heal(self, env: CaseEnvironment) -> None:
        """Release the straggler and return once its first write landed (the restart begins next)."""
        pids = _started(env)
        if not pids:
            return  # the trigger never fired
        (env.case_dir / RELEASE_FILE).touch()
        def gone() -> bool:
            return not any(is_running(pid) for pid in pids)

        if not wait_until((env.case_dir / FIRST_WRITE_FILE).exists, FIRST_WRITE_WAIT_S, interval_s=0.01,
                          give_up=gone):
            how = "exited" if gone() else f"did not write within {FIRST_WRITE_WAIT_S:.0f} s of its release"
            raise HarnessError(f"the straggler started for {env.case_dir} {how} before its first write; "
                               f"the case cannot show split brain")

    def teardown(self, env: CaseEnvironment) -> None:
        """SIGKILL every straggler this case started, by pid, and wait until each is gone."""
        pids = _started(env)
        for pid in pids:
            if _is_our_straggler(pid, env.case_dir):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
        wait_until(lambda: not any(is_running(pid) for pid in pids), EXIT_WAIT_S)


def _started(env: CaseEnvironment) -> list[int]:
    """The stragglers this case started (none where the trigger never fired)."""
    try:
        return [int(line) for line in (env.case_dir / PIDS_FILE).read_text().split()]
    except FileNotFoundError:
        return []


def _is_our_straggler(pid: int, case_dir: Path) -> bool:
    """Guard against a reused pid: the process must be this module, started for this case."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return MODULE in command and str(case_dir) in command


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    if not wait_until(Path(config["wait_for"]).exists, config["wait_s"], interval_s=0.005):
        return 0  # never released: the previous incarnation outlives its job only when asked to
    stale, targets = Path(config["source"]).read_bytes(), [Path(t) for t in config["targets"]]
    deadline = time.monotonic() + config["seconds"]
    _overwrite(targets, stale)
    Path(config["wrote"]).touch()  # the harness starts the restart now
    while time.monotonic() < deadline:
        time.sleep(config["interval"])
        _overwrite(targets, stale)
    return 0


def _overwrite(targets: list[Path], stale: bytes) -> None:
    """Each target replaced whole by the stale bytes (a reader never sees a torn file)."""
    for target in targets:
        staging = target.with_name(f".{target.name}.straggler")
        staging.write_bytes(stale)
        os.replace(staging, target)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
