"""`resilience repeat PATH... --times K`: run every case K times over, in rounds (the whole
selection, then again), and report each case whose verdict, restored step or pass/fail changed
between rounds. A verdict that depends on timing, leftovers of an earlier case, or a cold versus a
warm reference cache shows up here as a flaky case. With ``--also-backend`` the rounds alternate
between the two ways of starting ranks (``--backend``'s first), so a verdict that depends on how
ranks start shows up the same way. The exit status is 0 when every case gave the same result in
every round.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.case import Case
from ..errors import ResilienceError, Unavailable
from ..launch.backend import BACKENDS
from ..oracle.outcome import judge_case
from ..run.harness import Harness


@dataclass(frozen=True)
class Observation:
    """What one run of a case concluded; equal observations mean a repeatable case."""

    verdict: str  # a VerdictKind value, or "SKIPPED" / "ERROR" when the case could not run
    restored_step: int | None
    status: str  # passed | failed | xfailed | skipped | error


@dataclass(frozen=True)
class Repetition:
    case: str  # source[id]
    observations: tuple[Observation, ...]  # one per round
    backends: tuple[str, ...]  # how each round started its ranks

    @property
    def stable(self) -> bool:
        return len(set(self.observations)) == 1


def observe(harness: Harness, case: Case) -> Observation:
    try:
        result = harness.run(case)
    except Unavailable:
        return Observation("SKIPPED", None, "skipped")
    except ResilienceError as exc:
        return Observation("ERROR", None, f"error: {type(exc).__name__}")
    # power-loss cases too: their crash states follow one order of the ranks' ops in every run, and
    # the search over a save too large to enumerate is derandomized (docs/exploration.md)
    return Observation(result.verdict.kind.value, result.verdict.restored_step, judge_case(result).status)


def repeat(harnesses: dict[str, Harness], cases: list[Case], times: int,
           report: Callable[[str], None]) -> list[Repetition]:
    """``times`` rounds over ``cases``, round k by the k-th harness of ``harnesses`` (by backend name,
    in turn)."""
    rounds: list[list[Observation]] = []
    backends = tuple(list(harnesses)[index % len(harnesses)] for index in range(times))
    for index, backend in enumerate(backends):
        rounds.append([])
        for case in cases:
            rounds[-1].append(observe(harnesses[backend], case))
            seen = rounds[-1][-1]
            report(f"round {index + 1}/{times} ({backend}) {seen.status.upper():<7} {seen.verdict:<9} "
                   f"step {seen.restored_step} {case.source}[{case.id}]")
    return [Repetition(f"{case.source}[{case.id}]", tuple(r[i] for r in rounds), backends)
            for i, case in enumerate(cases)]


def summary(repetitions: list[Repetition], times: int) -> str:
    changed = [r for r in repetitions if not r.stable]
    lines = [f"CHANGED {r.case}: " + " | ".join(f"{o.verdict} step {o.restored_step} {o.status} ({backend})"
                                                 for o, backend in zip(r.observations, r.backends, strict=True))
             for r in changed]
    lines.append(f"{len(repetitions) - len(changed)}/{len(repetitions)} cases gave the same verdict in all "
                 f"{times} rounds; {len(changed)} changed")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--times", type=int, default=5, help="rounds over the selection (default 5)")
    parser.add_argument("--tier", choices=("smoke", "full"), default=None,
                        help="only the cases of this tier (default: every case but the deep tier, which --deep adds)")
    parser.add_argument("--json", type=Path, help="also write every observation to this file")
    parser.add_argument("--also-backend", choices=sorted(BACKENDS), default=None,
                        help="alternate the rounds between --backend and this way of starting ranks")


def select(cases: Iterable[Case], case_id: str | None, tier: str | None) -> list[Case]:
    return [c for c in cases if (case_id is None or c.id == case_id) and (tier is None or c.tier == tier)]


def main(args: argparse.Namespace, harness: Harness, cases: list[Case]) -> int:
    if args.times < 2:
        print(f"ERROR --times: must be at least 2 to compare rounds; got {args.times}", flush=True)
        return 2
    if not cases:
        print("ERROR no case selected", flush=True)
        return 2
    if args.also_backend in (None, args.backend):
        harnesses = {args.backend: harness}
    else:
        harnesses = {args.backend: harness, args.also_backend: harness.with_backend(BACKENDS[args.also_backend]())}
    repetitions = repeat(harnesses, cases, args.times, lambda line: print(line, flush=True))
    print(summary(repetitions, args.times), flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"stable": r.stable} for r in repetitions], indent=1))
    return 0 if all(r.stable for r in repetitions) else 1
