"""`resilience verify CHECKPOINT_DIR --strategy NAME [--world-size N] [--step-check]`: load an existing
checkpoint back with its strategy in real ranks and check it is complete and consistent across
ranks (and, with --step-check, that its loss is the one recorded at save time). Exit status 0 when
it is, 1 when it is not, 2 for bad arguments."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ResilienceError
from ..run.checkpoint_verify import case_for, verify_checkpoint
from ..scenario.strategy_options import parse_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", type=Path)
    parser.add_argument("--strategy", required=True, help="the strategy that wrote it (resilience list strategies)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a strategy option (value in YAML: true, 2, universal); repeatable")
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks to load with (default: the scenario's, or 2)")
    parser.add_argument("--scenario", type=Path, default=None,
                        help="the scenario file of the job that wrote the checkpoint: its workload and options")
    parser.add_argument("--case", default=None, help="with --scenario: which of its cases")
    parser.add_argument("--step-check", action="store_true",
                        help="also compare the evaluation loss with the one recorded at save time and run one step")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline for the whole check, seconds")


def main(args: argparse.Namespace) -> int:
    try:
        if args.world_size is not None and not 1 <= args.world_size <= 64:
            raise ResilienceError(f"--world-size {args.world_size}: out of range; allowed: 1..64")
        case = case_for(args.checkpoint_dir, args.strategy, parse_options(args.option), args.world_size,
                        args.scenario, args.case)
        verdict = verify_checkpoint(args.checkpoint_dir, case, step_check=args.step_check, deadline_s=args.timeout)
    except ResilienceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'OK' if verdict.ok else 'FAILED'}: {verdict.checkpoint_dir} with {verdict.strategy} "
          f"at world size {verdict.world_size}" + (f", step {verdict.step}" if verdict.step is not None else ""))
    for finding in verdict.findings:
        print(f"  {finding}")
    if not verdict.ok:
        for view in verdict.ranks:
            if (view.error or view.returncode not in (0, None)) and view.stderr_tail.strip():
                tail = "\n".join(view.stderr_tail.strip().splitlines()[-8:])
                print(f"--- rank {view.rank} stderr (tail) ---\n{tail}", file=sys.stderr)
    return 0 if verdict.ok else 1
