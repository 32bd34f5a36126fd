"""`resilience fuzz`: run a tier of the topology search and write what it finds as a scenario."""
from __future__ import annotations

import argparse
from pathlib import Path

from hypothesis import settings

from ..core.case import VerdictKind
from ..errors import ResilienceError
from ..fuzz.models import model_for
from ..fuzz.search import Counterexample, process_property, run_fast, write_scenario
from ..scenario.strategy_options import parse_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", required=True, help="built-in name or package.module:Class")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a strategy option (VALUE read as YAML), repeatable")
    parser.add_argument("--examples", type=int, default=None, help="Hypothesis examples (default: the profile's)")
    parser.add_argument("--profile", choices=("ci", "long"), default="ci")
    parser.add_argument("--storage", choices=("shared", "node_local", "any"), default="any")
    parser.add_argument("--tier", choices=("fast", "processes"), default="fast",
                        help="fast: the strategy's restore model, thousands of rank maps a second; "
                             "processes: real ranks through the harness")
    parser.add_argument("--out", type=Path, default=Path("fuzz-counterexamples"),
                        help="where a counterexample is written as a scenario file")


def main(args: argparse.Namespace) -> int:
    try:
        options = parse_options(args.option)
        storage = None if args.storage == "any" else args.storage
        if args.tier == "fast":
            factory = _factory(args.strategy, options)
            found, checked, seconds = run_fast(factory, storage, args.profile, args.examples)
            print(f"checked {checked} save/restart topology pairs in {seconds:.1f} s "
                  f"({checked / max(seconds, 1e-9):.0f} per second)", flush=True)
        else:
            found = _run_processes(args, options, storage)
    except ResilienceError as exc:
        print(f"ERROR {exc}")
        return 2
    if found is None:
        print(f"no SILENT or HANG restore found for {args.strategy}")
        return 0
    path = write_scenario(args.out, args.strategy, options, found)
    print(f"counterexample: {found}\nreplay: python -m resilience run {path}")
    return 1


def _factory(strategy: str, options: dict):
    model_for(strategy, False, options)  # fails here, with the reason, for a strategy without a model
    return lambda distinct: model_for(strategy, distinct, options)


def _run_processes(args: argparse.Namespace, options: dict, storage: str | None) -> Counterexample | None:
    from ..run.harness import Harness
    from ..run.reference_cache import ReferenceCache, default_cache_dir
    from ..scenario.loader import load_document

    harness = Harness(cache=ReferenceCache(default_cache_dir()))
    try:
        factory = _factory(args.strategy, options)
    except ResilienceError:
        factory = None  # no model: the real verdict alone is checked

    def run_case(document: dict) -> VerdictKind:
        case = load_document(document, f"<fuzz {args.strategy}>").cases[0]
        result = harness.run(case)
        print(f"  {result.verdict.kind.value:<9} {document['description']}", flush=True)
        return result.verdict.kind

    test = process_property(args.strategy, options, factory, run_case, storage or "shared")
    chosen = settings(settings.get_profile(args.profile), max_examples=args.examples or 3)
    try:
        chosen(test)()
    except Counterexample as found:
        return found
    return None
