"""`resilience audit --strategy TARGET`: Hypothesis draws whole scenarios (`fuzz.audit`), real ranks
run each, and the first one the strategy fails is shrunk and written as a scenario file with the
command that replays it. Exit status 1 when one was found, 0 when the budget found none.

With ``--control TARGET`` (the strategy's correct twin) a draw the strategy fails counts only if
the twin passes it: a draw both fail shows a weakness of the fault's kind (a bit flip in a format
without checksums), not of the change under audit; it is reported apart and the search goes on."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..planted.auditor import Auditor

BUDGETS = {"ci": (8, 12), "long": (200, 60)}  # profile -> (search runs, shrink runs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", required=True, metavar="TARGET", help="built-in name or package.module:Class")
    parser.add_argument("--profile", choices=sorted(BUDGETS), default="ci",
                        help="ci: reproducible (seeded by the strategy name), 8 search runs and 12 shrink runs; "
                             "long: random, 200 and 60")
    parser.add_argument("--runs", type=int, default=None, help="real runs for the search (default: the profile's)")
    parser.add_argument("--shrink-runs", type=int, default=None,
                        help="real runs for shrinking (default: the profile's)")
    parser.add_argument("--control", default=None, metavar="TARGET",
                        help="the strategy's correct twin: a failure counts only where the twin passes the same draw")
    parser.add_argument("--out", type=Path, default=Path("audit-counterexamples"),
                        help="where the shrunk scenario is written")


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
