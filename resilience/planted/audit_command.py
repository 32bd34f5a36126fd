"""`resilience audit --strategy TARGET`: Hypothesis draws whole scenarios (`fuzz.audit`), real ranks
run each, and the first one the strategy fails is shrunk and written as a scenario file with the
command that replays it. Exit status 1 when one was found, 0 when the budget found none."""
from __future__ import annotations

import argparse
import zlib
from pathlib import Path

from ..fuzz.audit import FAULTS, Draw, search, shrink
from ..fuzz.search import write_document
from .catalogue import Catcher
from .command import run_trial

BUDGETS = {"ci": (8, 12), "long": (200, 60)}  # profile -> (search runs, shrink runs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", required=True, metavar="TARGET", help="built-in name or package.module:Class")
    parser.add_argument("--profile", choices=sorted(BUDGETS), default="ci",
                        help="ci: reproducible (seeded by the strategy name), 8 search runs and 12 shrink runs; "
                             "long: random, 200 and 60")
    parser.add_argument("--runs", type=int, default=None, help="real runs for the search (default: the profile's)")
    parser.add_argument("--shrink-runs", type=int, default=None, help="real runs for shrinking (default: the profile's)")
    parser.add_argument("--out", type=Path, default=Path("audit-counterexamples"),
                        help="where the shrunk scenario is written")


def catcher_of(draw: Draw) -> Catcher:
    """The drawn scenario as a catcher: what a correct strategy may give in it."""
    accepts, fallback_ok = FAULTS[draw.fault]
    return Catcher(f"audit: {draw.describe()}", f"drawn by resilience audit: {draw.describe()}", draw.document(),
                   accepts, fallback_ok=fallback_ok)


class Auditor:
    """Runs drawn scenarios for one strategy through the harness, counting and printing each."""

    def __init__(self, harness, strategy: str, report=print):
        self.harness, self.strategy, self.report = harness, strategy, report
        self.runs: list[tuple[Draw, str]] = []

    def judge(self, draw: Draw) -> str:
        trial = run_trial(self.harness, catcher_of(draw), self.strategy, self.strategy)
        self.runs.append((draw, trial.judgement))
        self.report(f"  {trial.judgement:<14} {trial.verdict or '-':<9} {draw.describe()}"
                    + (f": {trial.evidence[:140]}" if trial.evidence else ""))
        return trial.judgement

    def audit(self, profile: str, runs: int, shrink_runs: int) -> tuple[Draw | None, int]:
        """The shrunk draw the strategy fails (or None), and the runs the shrink spent."""
        found = search(self.judge, profile, runs, zlib.crc32(self.strategy.encode()))
        if found is None:
            return None, 0
        self.report(f"caught: {found.describe()}; shrinking (at most {shrink_runs} runs)")
        return shrink(found, self.judge, shrink_runs)

    def write(self, found: Draw, directory: Path) -> Path:
        document = catcher_of(found).scenario(self.strategy, f"resilience audit of {self.strategy}")
        return write_document(directory, "audit", self.strategy, document)


def main(args: argparse.Namespace, harness) -> int:
    search_runs, shrink_runs = BUDGETS[args.profile]
    auditor = Auditor(harness, args.strategy, lambda line: print(line, flush=True))
    found, spent = auditor.audit(args.profile, args.runs or search_runs, args.shrink_runs or shrink_runs)
    ran = len(auditor.runs)
    if found is None:
        print(f"no failing scenario in {ran} runs for {args.strategy}", flush=True)
        return 0
    path = auditor.write(found, args.out)
    print(f"smallest failing scenario ({ran - spent} search runs, {spent} shrink runs): {found.describe()}\n"
          f"replay: python -m resilience run {path}", flush=True)
    return 1
