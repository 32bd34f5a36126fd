"""`resilience blackbox [--fault JSON] [--expect recovers|fails_loudly] SCRIPT [ARGS...]`: qualify your
own training script, unmodified, under torchrun (`{checkpoint_dir}` in ARGS
is replaced by each run's checkpoint directory). Exit status 0 when the verdict is the expected one."""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from ..core.case import EXPECTED_VERDICT, Outcome
from ..errors import ResilienceError
from ..run.blackbox import BlackBoxJob, describe, qualify_script
from ..run.reference_cache import ReferenceCache, default_cache_dir
from ..scenario.script_case import MAX_NODES


def add_blackbox_command(sub) -> None:
    command = sub.add_parser("blackbox", help="qualify your own training script under torchrun",
                             description=__doc__)
    command.add_argument("--fault", default='{"kind": "none"}',
                         help='JSON, e.g. {"kind": "kill", "rank": 1, "step": 6} (see README, black-box mode)')
    command.add_argument("--expect", choices=[o.value for o in Outcome], default=Outcome.RECOVERS.value)
    command.add_argument("--restart-args", help="the restart's own arguments, one string (e.g. "
                         "'--out {checkpoint_dir} --resume'); default: the first run's")
    command.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                         help="an environment variable for the script's ranks (repeatable)")
    command.add_argument("--oracle", choices=("bitwise", "envelope"), default="bitwise",
                         help="bitwise (two uninterrupted runs must agree first), or envelope: within the spread "
                              "of --references uninterrupted runs, widened --envelope-factor times")
    command.add_argument("--references", type=int, default=None, help="uninterrupted runs (default 2; envelope 3)")
    command.add_argument("--envelope-factor", type=float, default=2.0)
    command.add_argument("--nproc-per-node", type=int, default=2)
    command.add_argument("--nnodes", type=int, default=1, choices=range(1, MAX_NODES + 1), metavar=f"1..{MAX_NODES}",
                         help="nodes on this machine, each a network namespace with its own agent (root)")
    command.add_argument("--restart-nproc-per-node", type=int, default=None, choices=range(1, 65), metavar="1..64",
                         help="the restart's ranks per node, where it restarts at another world size (not judged "
                              "bitwise without --continuation-args)")
    command.add_argument("--continuation-args", default=None,
                         help="the arguments that resume the job at --restart-nproc-per-node ranks, one string: its "
                              "losses from an uninterrupted run's save are the rescaled restart's oracle")
    command.add_argument("--max-restarts", type=int, default=1)
    command.add_argument("--timeout", type=float, default=300.0, help="seconds per torchrun launch before HANG")
    command.add_argument("--workdir", type=Path)
    command.add_argument("--keep", action="store_true", help="keep the run's directory (logs, checkpoints)")
    command.add_argument("--cache", type=Path, help="where uninterrupted runs are cached (default: the "
                         "reference cache, RESILIENCE_CACHE)")
    command.add_argument("--no-cache", action="store_true", help="run the uninterrupted run afresh")
    command.add_argument("script", type=Path)
    command.add_argument("script_args", nargs=argparse.REMAINDER)


def blackbox_main(args: argparse.Namespace) -> int:
    try:
        fault = json.loads(args.fault)
    except json.JSONDecodeError as exc:
        print(f"ERROR --fault: not JSON ({exc}); got {args.fault!r}", flush=True)
        return 1
    bad_env = [item for item in args.env if "=" not in item]
    if bad_env:
        print(f"ERROR --env: not NAME=VALUE; got {bad_env[0]!r}", flush=True)
        return 1
    job = BlackBoxJob(script=args.script, args=tuple(args.script_args),
                      restart_args=tuple(shlex.split(args.restart_args)) if args.restart_args is not None else None,
                      env=dict(item.split("=", 1) for item in args.env), nproc_per_node=args.nproc_per_node,
                      nnodes=args.nnodes,
                      restart_nproc_per_node=args.restart_nproc_per_node,
                      continuation_args=(tuple(shlex.split(args.continuation_args))
                                         if args.continuation_args is not None else None),
                      max_restarts=args.max_restarts, launch_timeout_s=args.timeout, oracle=args.oracle,
                      references=args.references or (3 if args.oracle == "envelope" else 2),
                      envelope_factor=args.envelope_factor)
    try:
        cache = None if args.no_cache else ReferenceCache(args.cache or default_cache_dir())
        result = qualify_script(job, fault, work_root=args.workdir, keep=args.keep, cache=cache)
    except ResilienceError as exc:
        print(f"ERROR {exc}", flush=True)
        return 1
    expected = EXPECTED_VERDICT[Outcome(args.expect)]
    passed = result.verdict.kind is expected
    print(f"{'PASSED' if passed else 'FAILED'} {args.script}: {result.verdict.kind.value}, expected {expected.value}")
    print(describe(result), flush=True)
    return 0 if passed else 1
