"""`python -m resilience run PATH... [--case ID]`: run scenario files outside pytest and print verdicts.
`qualify` writes a qualification report, `verify` checks an existing checkpoint, `list` shows the
plug-ins, `torchrun` and `blackbox` run under torchrun, `explore` runs crash-state exploration,
`fuzz` searches save/restart topologies, `repeat` reruns cases to find flaky verdicts, `bisect`
finds the release of a library where a case's verdict changes, `planted`
measures caught / planted over deliberately broken strategies, `audit` searches drawn scenarios for
one a strategy fails."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core import compile_cache, registry
from ..core.interrupts import SIGTERM_EXIT_STATUS, Terminated, end_like_ctrl_c_on_sigterm
from ..launch.backend import BACKENDS, DEFAULT_BACKEND
from ..run.blackbox import run_script_case
from ..run.explore_records import PROFILES
from ..run.harness import Harness
from ..run.reference_cache import ReferenceCache, default_cache_dir
from .blackbox import add_blackbox_command, blackbox_main
from .case_loop import load_or_report, run_and_report, selection
from .torchrun import add_torchrun_command, torchrun_main


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What `run` and `explore` both take: the files, the case, where and how ranks run."""
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--case", help="run only the case with this id (as printed in reports), whatever its tier")
    parser.add_argument("--deep", action="store_true", help="also the cases of the deep tier (tier: deep)")
    _add_harness_arguments(parser)


def _add_harness_arguments(parser: argparse.ArgumentParser) -> None:
    """Where case work directories go and how ranks run."""
    parser.add_argument("--keep", action="store_true", help="keep each case's work directory")
    parser.add_argument("--workdir", type=Path, help="where case work directories go")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default=DEFAULT_BACKEND,
                        help="how rank processes are started")
    parser.add_argument("--cache", type=Path, default=None,
                        help="reference-run cache directory (default: $RESILIENCE_CACHE or ~/.cache/resilience)")
    parser.add_argument("--no-cache", action="store_true", help="run the reference in every case")


def main(argv: list[str] | None = None) -> int:
    """The command line; Ctrl-C or SIGTERM ends it with one line, once every process and directory
    the run started is gone (the supervisors and the janitor clean up as the interrupt unwinds)."""
    end_like_ctrl_c_on_sigterm()
    try:
        return _main(argv)
    except Terminated:
        print("resilience: terminated (SIGTERM); the processes, mounts and directories it started are removed",
              file=sys.stderr, flush=True)
        return SIGTERM_EXIT_STATUS
    except KeyboardInterrupt:
        print("resilience: interrupted; the processes, mounts and directories it started are removed",
              file=sys.stderr, flush=True)
        return 130


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="resilience", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_arguments(sub.add_parser("run", help="run scenario files (or directories of them)"))
    from . import fuzz
    fuzz.add_arguments(sub.add_parser("fuzz", help="search save/restart topologies for a SILENT or HANG restore",
                                      description=fuzz.__doc__))
    add_torchrun_command(sub)
    add_blackbox_command(sub)
    explore = sub.add_parser("explore", help="run only the power_loss cases of scenario files (crash-state "
                                             "exploration) and print what each explored")
    _add_run_arguments(explore)
    explore.add_argument("--profile", choices=sorted(PROFILES), default=None,
                         help="how much to explore (default: the scenario's fault.profile)")
    explore.add_argument("--max-restores", type=int, default=None,
                         help="distinct crash states restored by real ranks, at most")
    explore.add_argument("--no-reduce", action="store_true",
                         help="restore every distinct crash state for real, none judged with the restart of a "
                              "state its restore cannot tell apart (docs/exploration.md)")
    from . import catalog, qualify
    from . import verify as verify_cli
    qualify.add_arguments(sub.add_parser("qualify", help="run a scenario set and write a qualification report",
                                         description=qualify.__doc__))
    listing = sub.add_parser("list", help="the available strategies, faults or workloads, with their options")
    listing.add_argument("what", choices=sorted(catalog.KINDS))
    verify_cli.add_arguments(sub.add_parser("verify", help="load an existing checkpoint in real ranks and check it",
                                            description=verify_cli.__doc__))
    from . import planted
    planted_parser = sub.add_parser("planted", help="run the planted-bug catalogue (or bugs of your own) and print "
                                                    "caught / planted", description=planted.__doc__)
    _add_harness_arguments(planted_parser)
    planted.add_arguments(planted_parser)
    from . import audit
    audit_parser = sub.add_parser("audit", help="draw whole scenarios with Hypothesis, run them in real ranks and "
                                                "shrink the first the strategy fails", description=audit.__doc__)
    _add_harness_arguments(audit_parser)
    audit.add_arguments(audit_parser)
    from . import bisect
    bisect_parser = sub.add_parser("bisect", help="run one case across releases of a library and print where "
                                                  "its verdict changes", description=bisect.__doc__)
    _add_run_arguments(bisect_parser)
    bisect.add_arguments(bisect_parser)
    from . import repeat
    repeat_parser = sub.add_parser("repeat", help="run every case K times over and report any whose verdict "
                                                  "changed", description=repeat.__doc__)
    _add_run_arguments(repeat_parser)
    repeat.add_arguments(repeat_parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command != "list":
        compile_cache.keep_in_this_run()  # before any process the command starts
    if args.command == "qualify":
        return qualify.main(args)
    if args.command == "verify":
        return verify_cli.main(args)
    if args.command == "list":
        print(catalog.render(catalog.KINDS[args.what]))
        return 0
    if args.command == "torchrun":
        return torchrun_main(args)
    if args.command == "blackbox":
        return blackbox_main(args)
    if args.command == "fuzz":
        return fuzz.main(args)

    cache = None if args.no_cache else ReferenceCache(args.cache or default_cache_dir())
    harness = Harness(backend=BACKENDS[args.backend](), work_root=args.workdir, keep=args.keep, cache=cache,
                      explore_profile=getattr(args, "profile", None),
                      explore_restores=getattr(args, "max_restores", None),
                      explore_reduce=not getattr(args, "no_reduce", False))
    if args.command == "planted":
        return planted.main(args, harness)
    if args.command == "audit":
        return audit.main(args, harness)
    only = selection(args.case, args.deep)
    if args.command == "bisect":
        cases, broken = load_or_report(args.paths, only)
        return 1 if broken else bisect.main(args, harness, cases)
    if args.command == "repeat":
        cases, broken = load_or_report(args.paths, only)
        return 1 if broken else repeat.main(args, harness, repeat.select(cases, args.case, args.tier))
    if args.command == "explore":
        cases, broken = load_or_report(
            args.paths, lambda case: only(case) and registry.resolve("fault", case.fault.kind).explores)
        return 1 if run_and_report(cases, harness.run, show_findings=True) + broken else 0
    cases, broken = load_or_report(args.paths, only, scripts=True)
    return 1 if run_and_report(cases, harness.run, run_script=lambda case: run_script_case(
        case, work_root=args.workdir, keep=args.keep, cache=cache)) + broken else 0


if __name__ == "__main__":
    sys.exit(main())
