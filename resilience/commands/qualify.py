"""`resilience qualify PATH... [-k EXPR] --out DIR`: run a scenario set and write a qualification report.

Prints one line per case as it finishes; writes ``report.html`` (verdict matrix, loss curves, logs
of failures, replay commands, environment and filesystem figures), ``report.json`` and
``junit.xml`` into the output directory. Exit status 1 when any case fails (or, under
``CI=true``, is skipped), 2 when the run itself could not start.

``--workdir s3://BUCKET/PREFIX --endpoint URL`` qualifies an S3 store instead of a filesystem: the
cases' own files go to the system temporary directory, the probe PUTs and GETs one object there,
and each strategy that can checkpoint into an object store saves and restores its throughput case
in it (under a prefix of its own, removed afterwards); save is compared with PUT, restore with GET.
"""
from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from ..core import janitor, registry
from ..core.case import Case
from ..errors import ResilienceError
from ..launch.backend import BACKENDS, DEFAULT_BACKEND
from ..measure.environment import describe
from ..measure.fsprobe import DEFAULT_SIZE, measure_write_bandwidth
from ..measure.throughput import StrategyThroughput, measure
from ..oracle.outcome import CaseStatus
from ..report import html as qualify_html
from ..report import junit
from ..report.lost_work import lost_line, per_strategy
from ..report.qualification import Qualification
from ..run import launchers
from ..run.harness import Harness
from ..run.reference_cache import ReferenceCache, default_cache_dir
from ..scenario.loader import parse_size
from .case_loop import skips_fail
from .qualify_cases import run_cases, select

STAGGER_SHOWN = 1  # the per-rank scheme is also measured writing one rank at a time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", help="scenario files or directories of them")
    parser.add_argument("-k", dest="keyword", default=None,
                        help="select cases by expression over their id, file, strategy and fault, as pytest's -k "
                             "(e.g. 'rank0 and not deepspeed')")
    parser.add_argument("--deep", action="store_true", help="also the cases of the deep tier (tier: deep)")
    parser.add_argument("--out", type=Path, required=True, help="directory for report.html, report.json, junit.xml")
    parser.add_argument("--launcher", choices=launchers.LAUNCHERS, default="local",
                        help="how cases run: local (this harness) or torchrun (the elastic agent)")
    parser.add_argument("--workdir", default=None,
                        help="where case and checkpoint directories go: the filesystem to qualify "
                             "(default: the system temporary directory), or s3://BUCKET/PREFIX: the S3 store "
                             "to qualify (with --endpoint)")
    parser.add_argument("--endpoint", default=None,
                        help="with an s3:// --workdir: the store's endpoint URL (default: $AWS_ENDPOINT_URL)")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default=DEFAULT_BACKEND,
                        help="how the local launcher starts rank processes")
    parser.add_argument("--cache", type=Path, default=None, help="reference-run cache directory")
    parser.add_argument("--no-cache", action="store_true", help="run the reference in every case")
    parser.add_argument("--probe-size", default=f"{DEFAULT_SIZE >> 20}MiB",
                        help="bytes the raw write+fsync probe writes (default %(default)s)")
    parser.add_argument("--throughput-size", default="16MiB",
                        help="model parameter bytes of the throughput cases (default %(default)s)")
    parser.add_argument("--throughput-world-size", type=int, default=4, choices=range(1, 17), metavar="1..16",
                        help="ranks in the throughput cases (default %(default)s)")
    parser.add_argument("--no-throughput", action="store_true",
                        help="skip the filesystem probe and the throughput cases")


def filesystem_figures(cases: list[Case], target: Path, args, progress):
    """The raw probe, then each selected strategy (default options; per-rank also staggered)."""
    notes: list[str] = []
    probe_size = parse_size(args.probe_size)
    size = parse_size(args.throughput_size)
    if not probe_size or not size:
        raise ResilienceError(f"--probe-size {args.probe_size!r} / --throughput-size {args.throughput_size!r}: "
                              f"not a size; allowed: bytes, or a number with KiB, MiB, GiB")
    bandwidth = measure_write_bandwidth(target, probe_size)
    print(f"raw write+fsync in {target}: {bandwidth.bytes_per_s / 1e6:.1f} MB/s", file=progress, flush=True)
    variants: list[tuple[str, dict, str]] = []
    for name in dict.fromkeys(c.strategy.name for c in cases):
        if name == "none":
            continue
        variants.append((name, {}, name))
        if name == "torch.per_rank" and args.throughput_world_size > STAGGER_SHOWN:
            variants.append((name, {"stagger": STAGGER_SHOWN}, f"{name} {{stagger: {STAGGER_SHOWN}}}"))
    harness = Harness(backend=BACKENDS[args.backend](), work_root=target, keep=True, cache=None)
    figures: list[StrategyThroughput] = []
    for name, options, label in variants:
        missing = registry.resolve("strategy", name).missing()
        if missing:
            notes.append(f"throughput of {label} not measured: {missing}")
            continue
        try:
            figure = measure(harness, name, options, label, size, args.throughput_world_size, bandwidth.bytes_per_s)
        except (ResilienceError, RuntimeError) as exc:
            notes.append(f"throughput of {label} not measured: {exc}")
            continue
        figures.append(figure)
        print(f"throughput {label}: save {figure.save_fraction:.2f} x raw, restore {figure.restore_fraction:.2f} x raw",
              file=progress, flush=True)
    return bandwidth, tuple(figures), notes


def object_store_variants(cases: list[Case], notes: list[str]) -> list[tuple[str, dict, str]]:
    """Each selected strategy configured to write to an object store (dcp through fsspec); a
    strategy that writes files only gets a note instead."""
    variants = []
    for name in dict.fromkeys(c.strategy.name for c in cases if c.strategy.name != "none"):
        options = {"storage": "fsspec"} if name == "dcp" else {}
        problem = registry.resolve("strategy", name).check_object_store(options, "s3")
        if problem:
            notes.append(f"throughput of {name} not measured: {problem[1]}")
            continue
        variants.append((name, options, name + (" {storage: fsspec}" if options else "")))
    return variants


def object_store_figures(cases: list[Case], url: str, args, progress):
    """The PUT/GET probe of the store, then each strategy's throughput case checkpointing into it."""
    from ..measure.objprobe import describe_store, measure_object_bandwidth
    from ..objectstore.external import ExternalStore

    notes: list[str] = []
    endpoint = args.endpoint or os.environ.get("AWS_ENDPOINT_URL")
    probe_size, size = parse_size(args.probe_size), parse_size(args.throughput_size)
    if not probe_size or not size:
        raise ResilienceError(f"--probe-size {args.probe_size!r} / --throughput-size {args.throughput_size!r}: "
                              f"not a size; allowed: bytes, or a number with KiB, MiB, GiB")
    with janitor.temporary_directory("resilience-s3-") as scratch:
        probe_store = ExternalStore(url, endpoint, scratch).start()
        try:
            target = describe_store(probe_store)
            bandwidth = measure_object_bandwidth(probe_store, probe_size)
        finally:
            probe_store.stop()
    print(f"raw PUT / GET at {endpoint} ({url}): {bandwidth.put_bytes_per_s / 1e6:.1f} / "
          f"{bandwidth.get_bytes_per_s / 1e6:.1f} MB/s", file=progress, flush=True)
    harness = Harness(backend=BACKENDS[args.backend](), keep=True, cache=None,
                      object_store=lambda work_dir: ExternalStore(url, endpoint, work_dir))
    figures: list[StrategyThroughput] = []
    for name, options, label in object_store_variants(cases, notes):
        try:
            figure = measure(harness, name, options, label, size, args.throughput_world_size,
                             bandwidth.put_bytes_per_s, bandwidth.get_bytes_per_s, object_store="s3")
        except (ResilienceError, RuntimeError) as exc:
            notes.append(f"throughput of {label} not measured: {exc}")
            continue
        figures.append(figure)
        print(f"throughput {label}: save {figure.save_fraction:.2f} x PUT, restore {figure.restore_fraction:.2f} x GET",
              file=progress, flush=True)
    return target, bandwidth, tuple(figures), notes


def write_reports(report: Qualification, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"html": out / "report.html", "json": out / "report.json", "junit": out / "junit.xml"}
    paths["html"].write_text(qualify_html.render(report), encoding="utf-8")
    paths["json"].write_text(report.to_json(), encoding="utf-8")
    paths["junit"].write_text(junit.render(report), encoding="utf-8")
    return paths


def main(args: argparse.Namespace, progress=None) -> int:
    progress = progress or sys.stdout  # looked up now: a caller may have replaced it since import
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    store_url = args.workdir if args.workdir and args.workdir.startswith("s3://") else None
    work_root = None if store_url or not args.workdir else Path(args.workdir)
    try:
        if store_url:
            from ..objectstore.external import check_endpoint, split_url

            split_url(store_url)
            check_endpoint(args.endpoint or os.environ.get("AWS_ENDPOINT_URL"))
        cases, load_errors = select(args.paths, args.keyword, args.deep)
        cache = None if args.no_cache else ReferenceCache(args.cache or default_cache_dir())
        strategy_cases = [case for case in cases if isinstance(case, Case)]  # the figures measure their strategies
        run_case = launchers.make(args.launcher, work_root=work_root, keep=False, cache=cache, backend=args.backend)
    except ResilienceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for error in load_errors:
        print(f"ERROR {error}", file=progress, flush=True)
    if not cases and not load_errors:
        print("error: no case selected", file=sys.stderr)
        return 2
    print(f"qualifying {len(cases)} cases ({args.launcher} launcher)", file=progress, flush=True)
    records = run_cases(cases, run_case, progress, work_root, cache)
    target = work_root or Path(tempfile.gettempdir())
    bandwidth, figures, notes, store, object_bandwidth = None, (), [], None, None
    if args.no_throughput:
        notes.append("filesystem figures not measured (--no-throughput)")
    elif store_url:
        try:
            store, object_bandwidth, figures, notes = object_store_figures(strategy_cases, store_url, args, progress)
        except (ResilienceError, OSError, ValueError) as exc:
            notes.append(f"object store figures not measured: {exc}")
    else:
        try:
            with janitor.temporary_directory("resilience-fs-", _existing(target)) as probe_root:
                bandwidth, figures, notes = filesystem_figures(strategy_cases, probe_root, args, progress)
        except (ResilienceError, OSError, TimeoutError) as exc:
            notes.append(f"filesystem figures not measured: {exc}")
    notes.extend(f"scenario file not loaded: {error}" for error in load_errors)
    report = Qualification(started=started_at, elapsed_s=time.monotonic() - started, launcher=args.launcher,
                           command=shlex.join(["resilience", *getattr(args, "argv", ["qualify", *args.paths])]),
                           environment=describe(store_url or target, store), cases=tuple(records),
                           bandwidth=bandwidth, throughput=figures, notes=tuple(notes),
                           object_bandwidth=object_bandwidth)
    paths = write_reports(report, args.out)
    for row in per_strategy(report.cases):
        lost = lost_line(row.steps_lost, row.restart_s, row.replay_s)  # "-": not timed (a script's restart)
        restore = "" if row.restore_s is None else f"; restore {row.restore_s:.2f} s"
        print(f"lost work {row.strategy}: {f'{row.steps_lost} steps' if lost == '-' else lost} over {row.cases} "
              f"cases{restore}"
              + (f"; {row.refused_with_intact} refused with an intact older checkpoint" if row.refused_with_intact
                 else ""), file=progress, flush=True)
    skipped_in_ci = skips_fail() and any(r.status == CaseStatus.SKIPPED for r in records)
    failed = bool(report.failed or load_errors or skipped_in_ci)
    print(f"{'FAILED' if failed else 'PASSED'}: {len(report.failed)} of {len(records)} cases failed"
          + (f", {len(load_errors)} files not loaded" if load_errors else "")
          + (", skips count as failures under CI=true" if skipped_in_ci else "")
          + f"; report: {paths['html']}", file=progress, flush=True)
    return 1 if failed else 0


def _existing(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
