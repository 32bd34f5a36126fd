"""`resilience audit --strategy TARGET`: Hypothesis draws whole scenarios (`fuzz.audit`), real ranks
run each, and the first one the strategy fails is shrunk and written as a scenario file with the
command that replays it. Exit status 1 when one was found, 0 when the budget found none.

With ``--control TARGET`` (the strategy's correct twin) a draw the strategy fails counts only if
the twin passes it: a draw both fail shows a weakness of the fault's kind (a bit flip in a format
without checksums), not of the change under audit; it is reported apart and the search goes on."""
from __future__ import annotations

import argparse
import zlib
from pathlib import Path
from typing import Any

from ..fuzz.audit import FAULTS, Draw, search, shrink
from ..fuzz.search import write_document
from .catalogue import Catcher
from .command import ACCEPTED, CAUGHT, run_trial

BUDGETS = {"ci": (8, 12), "long": (200, 60)}  # profile -> (search runs, shrink runs)
FAILS_CONTROL = "control fails"  # caught, and so is the correct twin: not the audited change's failure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", required=True, metavar="TARGET", help="built-in name or package.module:Class")
    parser.add_argument("--profile", choices=sorted(BUDGETS), default="ci",
                        help="ci: reproducible (seeded by the strategy name), 8 search runs and 12 shrink runs; "
                             "long: random, 200 and 60")
    parser.add_argument("--runs", type=int, default=None, help="real runs for the search (default: the profile's)")
    parser.add_argument("--shrink-runs", type=int, default=None, help="real runs for shrinking (default: the profile's)")
    parser.add_argument("--control", default=None, metavar="TARGET",
                        help="the strategy's correct twin: a failure counts only where the twin passes the same draw")
    parser.add_argument("--out", type=Path, default=Path("audit-counterexamples"),
                        help="where the shrunk scenario is written")


def catcher_of(draw: Draw) -> Catcher:
    """The drawn scenario as a catcher: what a correct strategy may give in it."""
    accepts, fallback_ok = FAULTS[draw.fault]
    return Catcher(f"audit: {draw.describe()}", f"drawn by resilience audit: {draw.describe()}", draw.document(),
                   accepts, fallback_ok=fallback_ok)


class Auditor:
    """Runs drawn scenarios for one strategy through the harness, counting and printing each."""

    def __init__(self, harness, strategy: str, control: Any = None, report=print):
        self.harness, self.strategy, self.control, self.report = harness, strategy, control, report
        self.runs: list[tuple[Draw, str]] = []  # every draw judged, with its judgement
        self.real_runs = 0  # the strategy's runs and the control's

    def judge(self, draw: Draw) -> str:
        trial = self._run(draw, self.strategy)
        judgement = trial.judgement
        if judgement == CAUGHT and self.control is not None:
            twin = self._run(draw, self.control, as_control=True)
            if twin.judgement != ACCEPTED:
                judgement = FAILS_CONTROL
                self.report(f"  {FAILS_CONTROL:<14} the control {self.control} fails it too ({twin.verdict or '-'}): "
                            "not counted")
        self.runs.append((draw, judgement))
        return judgement

    def _run(self, draw: Draw, strategy: Any, as_control: bool = False):
        label = f"control of {self.strategy}" if as_control else self.strategy
        trial = run_trial(self.harness, catcher_of(draw), strategy, label)
        self.real_runs += 1
        self.report(f"  {trial.judgement:<14} {trial.verdict or '-':<9} {draw.describe()}"
                    + (" [control]" if as_control else "")
                    + (f": {trial.evidence[:140]}" if trial.evidence else ""))
        return trial

    def control_failures(self) -> list[Draw]:
        return [draw for draw, judgement in self.runs if judgement == FAILS_CONTROL]

    def audit(self, profile: str, runs: int, shrink_runs: int) -> tuple[Draw | None, int]:
        """The shrunk draw the strategy fails (or None), and the real runs the shrink spent."""
        counted = lambda: self.real_runs  # noqa: E731
        found = search(self.judge, profile, runs, zlib.crc32(self.strategy.encode()), counted)
        if found is None:
            return None, 0
        self.report(f"caught: {found.describe()}; shrinking (at most {shrink_runs} runs)")
        return shrink(found, self.judge, shrink_runs, counted)

    def write(self, found: Draw, directory: Path) -> Path:
        document = catcher_of(found).scenario(self.strategy, f"resilience audit of {self.strategy}")
        return write_document(directory, "audit", self.strategy, document)


def main(args: argparse.Namespace, harness) -> int:
    search_runs, shrink_runs = BUDGETS[args.profile]
    auditor = Auditor(harness, args.strategy, args.control, lambda line: print(line, flush=True))
    found, spent = auditor.audit(args.profile, args.runs or search_runs, args.shrink_runs or shrink_runs)
    ran = auditor.real_runs
    for draw in auditor.control_failures():
        print(f"failed by the control {args.control} too, not counted: {draw.describe()}", flush=True)
    if found is None:
        print(f"no failing scenario in {ran} runs for {args.strategy}", flush=True)
        return 0
    path = auditor.write(found, args.out)
    print(f"smallest failing scenario ({ran - spent} search runs, {spent} shrink runs): {found.describe()}\n"
          f"replay: python -m resilience run {path}", flush=True)
    return 1
