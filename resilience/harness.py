"""Runs one case: reference -> first run (fault armed) -> restart -> [continuation], then verify.

Every phase has a deadline; the whole rank group is destroyed at the end of every phase, on the
first rank failure (as torchrun does) and on any exception in the harness itself.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import janitor, plugins
from .backend import BACKENDS, DEFAULT_BACKEND, ProcessBackend, SpawnBackend
from .errors import HarnessError, StrategyUnavailable
from .faults.base import CaseEnvironment
from .interpreters import for_restart
from .phases import CONTINUATION, FIRST_RUN, REFERENCE, RESTART, PhasePlan
from .reference_cache import ReferenceCache, reference_key
from .scenario import Case
from .topology import Topology
from .verify import Verdict, judge

POLL_S = 0.02
STACK_DUMP_WAIT_S = 1.0
LOG_TAIL_CHARS = 3000
TEARDOWN_GRACE_S = 1.0  # how long survivors of a rank failure run on before the group is torn down


@dataclass(frozen=True)
class RankError:
    """The evidence of a LOUD verdict: who failed, where, with what."""

    rank: int
    phase: str
    type: str
    message: str
    traceback: str
    time: float
    chain: tuple[str, ...] = ()  # 'Type: message' of the exceptions it was raised from

    def summary(self) -> str:
        head = f"{self.type}: {self.message}"
        return head + "".join(f" (from {link})" for link in self.chain)


@dataclass(frozen=True)
class RankRecord:
    rank: int
    returncode: int | None
    events: tuple[dict, ...]
    stdout_tail: str
    stderr_tail: str


@dataclass(frozen=True)
class PhaseResult:
    name: str
    world_size: int
    status: str  # "completed", "failed", "fault_killed" or "deadline"
    ranks: tuple[RankRecord, ...]
    first_error: RankError | None
    fault_events: tuple[dict, ...]
    elapsed_s: float
    hang_summary: tuple[str, ...] = ()  # at a deadline: where each rank was waiting

    def events(self, kind: str) -> list[dict]:
        return [e for record in self.ranks for e in record.events if e["event"] == kind]

    def losses(self, rank: int) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.ranks[rank].events if e["event"] == "loss"}

    def restored(self) -> dict[int, dict]:
        return {e["rank"]: e for e in self.events("restored")}


@dataclass(frozen=True)
class CaseResult:
    case: Case
    verdict: Verdict
    phases: tuple[PhaseResult, ...]
    work_dir: Path

    @property
    def fault_fired(self) -> bool:
        return any(phase.fault_events for phase in self.phases)

    # -- figures a qualification report shows (derived from the phases' events) ----------------
    def phase(self, name: str) -> PhaseResult | None:
        return next((p for p in self.phases if p.name == name), None)

    def loss_series(self, name: str) -> dict[int, float]:
        """Loss per step in phase ``name``, from whichever ranks reported it (a killed rank stops early)."""
        found = self.phase(name)
        series: dict[int, float] = {}
        for record in found.ranks if found else ():
            for event in record.events:
                if event["event"] == "loss":
                    series.setdefault(event["step"], event["loss"])
        return dict(sorted(series.items()))

    @property
    def steps_lost(self) -> int | None:
        """Steps the first run had trained that the restart had to train again (None: no restore)."""
        restored, trained = self.verdict.restored_step, self.loss_series("first_run")
        return None if restored is None else max(0, max(trained, default=0) - restored)

    @property
    def restore_s(self) -> float | None:
        """Wall time of the restart's ``strategy.load``: its slowest rank."""
        restart = self.phase("restart")
        times = [e["load_s"] for e in restart.events("restored") if "load_s" in e] if restart else []
        return max(times) if times else None

    @property
    def save_s(self) -> dict[int, float]:
        """Per checkpoint step saved on every rank: first ``save_begin`` to last ``save_returned``."""
        first_run = self.phase("first_run")
        if first_run is None:
            return {}
        begun: dict[int, list[float]] = {}
        returned: dict[int, list[float]] = {}
        for event in first_run.events("save_begin"):
            begun.setdefault(event["step"], []).append(event["time"])
        for event in first_run.events("save_returned"):
            returned.setdefault(event["step"], []).append(event["time"])
        return {step: max(returned[step]) - min(begun[step]) for step in sorted(returned)
                if len(returned[step]) == first_run.world_size and step in begun}


class Harness:
    """Runs cases. ``cache``: a `ReferenceCache` to share reference runs across cases (None: run
    the reference in every case)."""

    def __init__(self, backend: ProcessBackend | None = None, work_root: Path | None = None, keep: bool = False,
                 cache: ReferenceCache | None = None, explore_profile: str | None = None,
                 explore_restores: int | None = None):
        self.backend = backend or BACKENDS[DEFAULT_BACKEND]()
        self.work_root, self.keep, self.cache = work_root, keep, cache
        # power_loss cases: the explorer's profile (ci, long) and cap on restores, overriding the scenario's
        self.explore_profile, self.explore_restores = explore_profile, explore_restores

    def run(self, case: Case) -> CaseResult:
        missing = plugins.resolve("strategy", case.strategy.name).missing_for(case.strategy.options)
        if missing:
            raise StrategyUnavailable(f"strategy {case.strategy.name} needs {missing}")
        with janitor.temporary_directory("resilience-", self.work_root, self.keep) as work_dir:
            return self._run(case, work_dir)

    def _run(self, case: Case, work_dir: Path) -> CaseResult:
        checkpoint_dir = work_dir / "checkpoints"
        checkpoint_dir.mkdir()
        case_file = work_dir / "case.json"
        case_file.write_text(json.dumps({"source": case.source, "id": case.id, "document": case.document}))
        plan = _Planner(case, work_dir, case_file, checkpoint_dir)
        reference, snapshots = self._reference(case, plan)
        if plugins.resolve("fault", case.fault.kind).explores:
            from .explore import Explorer

            return Explorer(self, self.explore_profile, self.explore_restores).run(
                case, work_dir, checkpoint_dir, plan, reference)
        fault = plugins.resolve("fault", case.fault.kind)(case.fault)
        env = CaseEnvironment(case=case, case_dir=work_dir, checkpoint_dir=checkpoint_dir)
        phases = [reference]
        try:
            fault.setup(env)
            phases.append(self._phase(plan.make(FIRST_RUN, case.workload.world_size, "fresh",
                                                save=True, inject=True, topology=case.placement), case,
                                      supervisor=fault if fault.supervises else None))
            fault.heal(env)
            restart = self._phase(plan.make(RESTART, case.restart.world_size, "strategy", save=True,
                                            rank_map=case.restart.rank_map, topology=case.restart.placement), case,
                                  backend=self._restart_backend(case))
            phases.append(restart)
            restored = restart.restored()
            if case.topology_changes and 0 in restored and snapshots is not None:
                step = restored[0]["step"]
                if (snapshots / f"step_{step}").is_dir():
                    phases.append(self._phase(plan.make(CONTINUATION, case.restart.world_size, "snapshot",
                                                        snapshot_dir=snapshots, snapshot_step=step,
                                                        topology=case.restart.placement), case))
            found = fault.findings(env, tuple(phases))
        finally:
            fault.teardown(env)
        verdict = judge(case, *phases, fault_findings=found)
        return CaseResult(case=case, verdict=verdict, phases=tuple(phases), work_dir=work_dir)

    def _reference(self, case: Case, plan: "_Planner") -> tuple[PhaseResult, Path | None]:
        """The reference phase and its snapshot directory (only kept when the topology changes)."""
        keep_snapshots = case.topology_changes

        def run_into(directory: Path) -> PhaseResult:
            result = self._phase(plan.make(REFERENCE, case.workload.world_size, "fresh", record_states=True,
                                           snapshot_dir=directory / "snapshots" if keep_snapshots else None,
                                           phase_dir=directory / REFERENCE, topology=case.placement), case)
            if result.status != "completed":
                raise HarnessError(f"the uninterrupted reference run did not complete ({result.status}): "
                                   f"{result.first_error.summary() if result.first_error else ''}\n"
                                   + _tails(result))
            return result

        if self.cache is None:
            return run_into(plan.work_dir), plan.work_dir / "snapshots" if keep_snapshots else None
        entry = self.cache.entry(reference_key(case, keep_snapshots), run_into)
        stored = PhasePlan.read(entry / REFERENCE / "plan.json")
        stored = replace(stored, phase_dir=str(entry / REFERENCE))
        result = _collect(stored, "completed", [0] * stored.world_size, 0.0)
        return result, entry / "snapshots" if keep_snapshots else None

    @staticmethod
    def _restart_backend(case: Case) -> ProcessBackend | None:
        """Another interpreter or layered packages for the restart (an upgrade to qualify): its
        ranks are spawned, since the forkserver holds this environment's modules."""
        interpreter = for_restart(case.restart.python, case.restart.packages, case.source)
        return SpawnBackend(interpreter) if interpreter else None

    def _phase(self, plan: PhasePlan, case: Case, supervisor=None,
               backend: ProcessBackend | None = None) -> PhaseResult:
        phase_dir = Path(plan.phase_dir)
        phase_dir.mkdir(parents=True)
        plan_path = phase_dir / "plan.json"
        plan.write(plan_path)
        started = time.monotonic()
        deadline = started + case.timeouts.phase_s
        ranks = (backend or self.backend).start(plan, plan_path)
        status, codes, stopped = "completed", [None] * len(ranks), set()
        try:
            while True:
                codes = [r.poll() for r in ranks]  # ranks still None here are torn down, not failed
                if any(code not in (None, 0) for code in codes):
                    status = "failed"
                    codes = self._grace(ranks, codes)
                    break
                if all(code == 0 for code in codes):
                    break
                if supervisor is not None:
                    supervisor.supervise(_phase_events(plan), ranks)
                if time.monotonic() > deadline:
                    status = "deadline"
                    stopped = {rank.rank for rank in ranks if rank.is_stopped()}
                    for rank in ranks:  # faulthandler in each rank prints every thread's stack
                        rank.signal(signal.SIGUSR1)
                    time.sleep(STACK_DUMP_WAIT_S)
                    break
                time.sleep(POLL_S)
        finally:
            for rank in ranks:
                rank.destroy()
        result = _collect(plan, status, codes, time.monotonic() - started)
        if status == "deadline":
            result = replace(result, hang_summary=tuple(
                _where_waiting(record, record.rank in stopped) for record in result.ranks
                if record.returncode is None))
        return result

    @staticmethod
    def _grace(ranks, codes: list[int | None]) -> list[int | None]:
        """Like torchrun's agent, notice a failure a moment late: survivors finish the write they are
        in (a peer's death reaches them at their next collective) instead of being cut at a random byte."""
        until = time.monotonic() + TEARDOWN_GRACE_S
        while time.monotonic() < until and any(code is None for code in codes):
            time.sleep(POLL_S)
            codes = [r.poll() for r in ranks]
        return codes


class _Planner:
    def __init__(self, case: Case, work_dir: Path, case_file: Path, checkpoint_dir: Path):
        self.case, self.work_dir, self.case_file, self.checkpoint_dir = case, work_dir, case_file, checkpoint_dir

    def placement(self, name: str) -> Topology:
        """The topology a phase runs at: the restart's for the restart and the oracle's continuation."""
        return self.case.restart.placement if name in (RESTART, CONTINUATION) else self.case.placement

    def make(self, name: str, world_size: int, start: str, *, save: bool = False, inject: bool = False,
             record_states: bool = False, snapshot_dir: Path | None = None, snapshot_step: int | None = None,
             rank_map: tuple[int, ...] | None = None, phase_dir: Path | None = None,
             topology: Topology | None = None) -> PhasePlan:
        phase_dir = phase_dir or self.work_dir / name
        return PhasePlan(
            name=name, case_file=str(self.case_file), world_size=world_size,
            store_path=str(phase_dir / "store"), checkpoint_dir=str(self.checkpoint_dir),
            phase_dir=str(phase_dir), start=start, save=save,
            inject=inject, record_states=record_states,
            snapshot_dir=str(snapshot_dir) if snapshot_dir else None, snapshot_step=snapshot_step,
            rank_map=rank_map or tuple(range(world_size)),
            collective_timeout_s=self.case.timeouts.collective_s,
            topology=(topology or self.placement(name)).as_dict())


def collect_phase(plan: PhasePlan, status: str, codes: list[int | None], elapsed: float) -> PhaseResult:
    """A phase's result from the files its ranks wrote (``codes``: exit statuses, None for a rank
    torn down by its launcher), whoever started them: this harness or another launcher."""
    return _collect(plan, status, codes, elapsed)


def where_waiting(record: RankRecord, stopped: bool) -> str:
    """Where a rank of a phase past its deadline waits, from the stack it dumped (see `_where_waiting`)."""
    return _where_waiting(record, stopped)


def _collect(plan: PhasePlan, status: str, codes: list[int | None], elapsed: float) -> PhaseResult:
    records = []
    for rank, code in enumerate(codes):
        out_path, err_path = plan.log_paths(rank)
        records.append(RankRecord(rank=rank, returncode=code, events=tuple(_read_events(plan.events_path(rank))),
                                  stdout_tail=_tail(out_path), stderr_tail=_tail(err_path)))
    fault_events = tuple(e for r in records for e in r.events if e["event"] == "fault_fired")
    first_error = None
    if status == "failed":
        first_error = _first_error(plan.name, records, fault_events)
        if first_error is None:
            status = "fault_killed"
    return PhaseResult(name=plan.name, world_size=plan.world_size, status=status, ranks=tuple(records),
                       first_error=first_error, fault_events=fault_events, elapsed_s=elapsed)


def _first_error(phase: str, records: list[RankRecord], fault_events: tuple[dict, ...]) -> RankError | None:
    """The earliest failure, unless an injected kill came first (peers' errors are its consequences)."""
    kill_times = [e["time"] for e in fault_events if e.get("ends_process")]
    errors = []
    for record in records:
        raised = [e for e in record.events if e["event"] == "error"]
        if raised:
            e = raised[0]
            errors.append(RankError(record.rank, phase, e["type"], e["message"], e.get("traceback", ""), e["time"],
                                    tuple(e.get("chain", ()))))
        elif record.returncode not in (None, 0) and not any(e.get("ends_process") for e in record.events):
            errors.append(_crash(phase, record))
    errors.sort(key=lambda e: e.time)
    if kill_times and (not errors or min(kill_times) <= errors[0].time):
        return None
    return errors[0] if errors else None


def _crash(phase: str, record: RankRecord) -> RankError:
    """A rank that died without raising (segfault, std::terminate, an outside SIGKILL): still loud."""
    code = record.returncode
    if code is not None and code < 0:
        kind, what = "Crash", f"rank {record.rank} killed by {signal.Signals(-code).name}"
    else:
        kind, what = "Crash", f"rank {record.rank} exited with status {code} without raising"
    last_lines = [line for line in record.stderr_tail.strip().splitlines() if line.strip()][-3:]
    message = what + (": " + " | ".join(last_lines) if last_lines else "")
    return RankError(record.rank, phase, kind, message, record.stderr_tail, time.time())


FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def _where_waiting(record: RankRecord, stopped: bool) -> str:
    """From a rank's faulthandler dump: the collective it waits in and the first frame outside torch."""
    if stopped:
        return f"rank {record.rank}: stopped (SIGSTOP), so it cannot dump its stack"
    dump = record.stderr_tail.rsplit("most recent call first", 1)
    if len(dump) < 2:
        return f"rank {record.rank}: no stack dumped"
    frames = [m.groupdict() for m in map(FRAME.match, dump[1].splitlines()) if m]
    collective = next((f["func"] for f in frames if f["path"].endswith("distributed_c10d.py")), None)
    caller = next((f for f in frames if "/torch/" not in f["path"]), None)
    where = f"{caller['path']}:{caller['line']} in {caller['func']}" if caller else "unknown"
    return f"rank {record.rank}: " + (f"waiting in {collective}, called from {where}" if collective else f"at {where}")


def _phase_events(plan: PhasePlan) -> list[dict]:
    return [e for rank in range(plan.world_size) for e in _read_events(plan.events_path(rank))]


def _read_events(path: Path) -> list[dict]:
    events = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return events
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a killed rank may be cut
            continue
    return events


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - LOG_TAIL_CHARS))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _tails(phase: PhaseResult) -> str:
    return "\n".join(f"--- rank {r.rank} stderr ---\n{r.stderr_tail}" for r in phase.ranks if r.stderr_tail.strip())

