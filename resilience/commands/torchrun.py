"""`resilience torchrun PATH... [--case ID] [--nnodes N --nproc-per-node M --max-restarts R ...]`:
scenario cases run under torchrun (one job per case), verdicts printed as `resilience run` does."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..run.torchrun import STARTUP_S, run_case_under_torchrun
from .case_loop import load_or_report, run_and_report


def add_torchrun_command(sub) -> None:
    command = sub.add_parser("torchrun", help="run scenario cases under torchrun (elastic restarts)",
                             description=__doc__)
    command.add_argument("paths", nargs="+", help="scenario files or directories of them")
    command.add_argument("--case", help="run only the case with this id")
    command.add_argument("--nnodes", type=_nnodes, default=(None, 1), metavar="N|MIN:MAX",
                         help="nodes in the job; MIN:MAX is elastic (the job goes on with at least MIN)")
    command.add_argument("--nproc-per-node", type=int, default=None,
                         help="default: the case's world size divided by --nnodes")
    command.add_argument("--max-restarts", type=int, default=1)
    command.add_argument("--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (several nodes); "
                                                 "without it, one node runs --standalone")
    command.add_argument("--rdzv-id", help="the job id shared by every node (default: from --case-dir)")
    command.add_argument("--rdzv-conf", help="torchrun's --rdzv-conf, e.g. is_host=1 on the node serving the "
                                             "store when it cannot tell from its host name, and the "
                                             "rendezvous timeouts")
    command.add_argument("--local-addr", help="torchrun's --local-addr: this node's address")
    command.add_argument("--join", action="store_true",
                         help="join a job the other nodes already run in --case-dir (a spare node)")
    command.add_argument("--standby", type=Path, metavar="PATH",
                         help="with --join: a spare standing by, whose agent starts once PATH exists")
    command.add_argument("--case-dir", type=Path,
                         help="the case directory, the same shared path on every node (one case only); kept")
    command.add_argument("--workdir", type=Path, help="where fresh case directories go")
    command.add_argument("--keep", action="store_true", help="keep each fresh case directory")
    command.add_argument("--startup", type=float, default=STARTUP_S,
                         help="seconds allowed for torchrun's start and rendezvous before a phase deadline counts")


def torchrun_main(args: argparse.Namespace) -> int:
    cases, failures = load_or_report(args.paths, lambda case: not args.case or case.id == args.case)
    if args.case_dir and len(cases) != 1:
        print(f"ERROR --case-dir {args.case_dir}: names the directory of one case; got {len(cases)} cases "
              f"(select one with --case)", flush=True)
        return 1

    def run_case(case):
        return run_case_under_torchrun(
            case, args.nnodes[1], args.nproc_per_node, args.max_restarts, rdzv_endpoint=args.rdzv_endpoint,
            rdzv_id=args.rdzv_id, case_dir=args.case_dir, work_root=args.workdir, keep=args.keep,
            startup_s=args.startup, rdzv_conf=args.rdzv_conf, local_addr=args.local_addr,
            min_nodes=args.nnodes[0], join=args.join, standby=args.standby)

    # on several nodes the findings say what each node's driver saw (a spare grown back in, a node frozen)
    several = args.nnodes[0] is not None or args.nnodes[1] > 1
    return 1 if run_and_report(cases, run_case, show_findings=several) + failures else 0


def _nnodes(text: str) -> tuple[int | None, int]:
    """"N" -> (None, N); "MIN:MAX" -> (MIN, MAX)."""
    low, _, high = text.rpartition(":")
    try:
        pair = (int(low) if low else None, int(high))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nnodes {text!r}: allowed: N or MIN:MAX (integers)") from None
    if pair[1] < 1 or (pair[0] is not None and not 1 <= pair[0] <= pair[1]):
        raise argparse.ArgumentTypeError(f"--nnodes {text!r}: allowed: N >= 1, or 1 <= MIN <= MAX")
    return pair
