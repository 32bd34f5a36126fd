"""`resilience planted`: run every planted bug in the case that must catch it, and each catcher with
the bug's correct twin (the control), then print caught / planted.

``--strategy TARGET`` plants bugs of your own (any strategy written against the contract): each meets
the catchers cheapest first until one catches it (``--all``: every catcher). The exit status is 0
when every planted bug is caught and every control accepted.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from ..planted.catalogue import BUGS
from ..planted.trials import BugResult, audit, run_catalogue, summary
from ..run.harness import Harness


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", action="append", default=[], metavar="TARGET",
                        help="plant a strategy of your own (package.module:Class), repeatable; "
                             "with it, the built-in catalogue runs only with --catalogue")
    parser.add_argument("--catalogue", action="store_true", help="run the built-in catalogue with --strategy too")
    parser.add_argument("--only", action="append", default=[], metavar="BUG",
                        help="run only this built-in bug, repeatable: " + ", ".join(b.name for b in BUGS))
    parser.add_argument("--all", action="store_true", help="run a --strategy in every catcher, not only "
                                                           "until the first catch")
    parser.add_argument("--no-controls", action="store_true", help="skip the correct twins")
    parser.add_argument("--json", type=Path, help="also write every trial to this file")


def main(args: argparse.Namespace, harness: Harness) -> int:
    unknown = sorted(set(args.only) - {b.name for b in BUGS})
    if unknown:
        print(f"ERROR --only: unknown planted bug {', '.join(unknown)}; "
              f"allowed: {', '.join(b.name for b in BUGS)}", flush=True)
        return 2

    def report(line: str) -> None:
        print(line, flush=True)

    results: list[BugResult] = []
    if args.catalogue or args.only or not args.strategy:
        bugs = tuple(b for b in BUGS if not args.only or b.name in args.only)
        results += run_catalogue(harness, bugs, not args.no_controls, report)
    for strategy in args.strategy:
        report(f"planted {strategy}:")
        results.append(audit(harness, strategy, args.all, report))
    print(summary(results), flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"caught": r.caught} for r in results], indent=1))
    return 0 if all(r.caught and r.control_ok for r in results) else 1
