"""`python -m resilience run PATH... [--case ID]`: run scenario files outside pytest and print verdicts.
`qualify` writes a qualification report, `verify` checks an existing checkpoint, `list` shows the plug-ins."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .backend import BACKENDS, DEFAULT_BACKEND
from .errors import ResilienceError, Unavailable
from .harness import Harness
from .loader import is_scenario_file, load_file
from .outcome import judge_case
from .reference_cache import ReferenceCache, default_cache_dir
from .report import render, verdict_line


def _scenario_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if is_scenario_file(p)))
        else:
            files.append(path)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resilience", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenario files (or directories of them)")
    run.add_argument("paths", nargs="+")
    run.add_argument("--case", help="run only the case with this id (as printed in reports)")
    run.add_argument("--keep", action="store_true", help="keep each case's work directory")
    run.add_argument("--workdir", type=Path, help="where case work directories go")
    run.add_argument("--backend", choices=sorted(BACKENDS), default=DEFAULT_BACKEND,
                     help="how rank processes are started")
    run.add_argument("--cache", type=Path, default=None,
                     help="reference-run cache directory (default: $RESILIENCE_CACHE or ~/.cache/resilience)")
    run.add_argument("--no-cache", action="store_true", help="run the reference in every case")
    from . import catalog, qualify, verify_cli
    qualify.add_arguments(sub.add_parser("qualify", help="run a scenario set and write a qualification report",
                                         description=qualify.__doc__))
    listing = sub.add_parser("list", help="the available strategies, faults or workloads, with their options")
    listing.add_argument("what", choices=sorted(catalog.KINDS))
    verify_cli.add_arguments(sub.add_parser("verify", help="load an existing checkpoint in real ranks and check it",
                                            description=verify_cli.__doc__))
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "qualify":
        return qualify.main(args)
    if args.command == "verify":
        return verify_cli.main(args)
    if args.command == "list":
        print(catalog.render(catalog.KINDS[args.what]))
        return 0

    cache = None if args.no_cache else ReferenceCache(args.cache or default_cache_dir())
    harness = Harness(backend=BACKENDS[args.backend](), work_root=args.workdir, keep=args.keep, cache=cache)
    failures = 0
    for path in _scenario_files(args.paths):
        try:
            scenario = load_file(path)
        except ResilienceError as exc:
            print(f"ERROR {exc}", flush=True)
            failures += 1
            continue
        for case in scenario.cases:
            if args.case and case.id != args.case:
                continue
            try:
                result = harness.run(case)
            except Unavailable as exc:
                print(f"SKIPPED {case.source}[{case.id}]: {exc}", flush=True)
                failures += os.environ.get("CI") == "true"  # as under pytest: a missing install must not hide
                continue
            except ResilienceError as exc:
                print(f"ERROR {case.source}[{case.id}]: {exc}", flush=True)
                failures += 1
                continue
            outcome = judge_case(result)
            print(f"{outcome.status.upper():<6} {verdict_line(result)}", flush=True)
            if outcome.status == "failed":
                failures += 1
                print(render(result, outcome.reason), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
