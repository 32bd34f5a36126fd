"""Speed of the harness, as ratios measured side by side in one run (never absolute times).

    python benchmarks/bench.py            # everything (several minutes on 2 cores)
    python benchmarks/bench.py --quick    # fewer repetitions

(a) one 2-rank no-fault case end to end (fork backend, warm server, cached reference) vs one cold
    `torchrun --standalone` launch of the same 2-rank training; goal <= 0.5
(b) a 512 MiB torch.save through the interception layer (no fault armed) vs torch.save to a plain
    path: throughput ratio, goal >= 0.9
(c) randomly drawn kill cases ("fuzz examples") per minute: fork backend vs spawn backend
(d) the shipped scenario suite with -n 2 vs serial, both with a warm reference cache (a first
    -n 2 run fills it), its seconds per case, whether every case id got the same verdict in both
    (pytest's junit XML), and how busy the serial run kept the cores (the floor of the ratio)
(e) a DeepSpeed ZeRO-2 kill case end to end vs one cold `torchrun` launch of the same DeepSpeed
    training (where DeepSpeed is installed)
(f) crash-state restores per second in warm ranks / in fresh forked ranks (the explorer's own
    restores of the torch.per_rank power-loss case, timed one by one); goal >= 10x
(g) that power-loss case's wall time / (distinct states explored x one warm restore); goal <= 1.5
(h) a black-box case of examples/train_ddp.py (a kill, torchrun's restart) with its references
    cached vs the faulted job's own torchrun launches in that case; goal <= 1.3
plus peak memory of the harness and of the ranks, and harness memory / open files across many
cases in one process (no growth means no leak).
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# the checkout's package, not an installed one: imported once the path is set (E402)
from resilience.core.interrupts import end_like_ctrl_c_on_sigterm  # noqa: E402
from resilience.launch.backend import BACKENDS  # noqa: E402
from resilience.run.harness import Harness  # noqa: E402
from resilience.run.reference_cache import ReferenceCache  # noqa: E402
from resilience.scenario.loader import load_document, load_file  # noqa: E402

NO_FAULT = ROOT / "scenarios" / "no_fault.scenario.yaml"
DEEPSPEED = ROOT / "scenarios" / "deepspeed_no_fault.scenario.yaml"
POWER_LOSS = ROOT / "scenarios" / "power_loss_torch.scenario.yaml"
EXAMPLE_SCRIPT = ROOT / "examples" / "train_ddp.py"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def bench_case_vs_torchrun(harness: Harness, repeats: int, scenario: Path = NO_FAULT,
                           index: int = 0) -> tuple[float, list]:
    case = load_file(scenario).cases[index]
    harness.run(case)  # warm the forkserver and the reference cache
    env = dict(os.environ, BENCH_SCENARIO=str(scenario), BENCH_CASE=str(index), OMP_NUM_THREADS="1",
               BENCH_CHECKPOINTS=tempfile.gettempdir())  # never written: the job trains only
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(ROOT / "benchmarks" / "torchrun_train.py")]
    ratios, results = [], []
    with tempfile.TemporaryDirectory(prefix="resilience-bench-torchrun-") as scratch:
        env["TMPDIR"] = scratch  # torchrun keeps a torchelastic_* directory per launch
        for _ in range(repeats):
            result = []
            case_s = timed(lambda result=result: result.append(harness.run(case)))
            cold_s = timed(lambda: subprocess.run(torchrun, env=env, check=True, capture_output=True))
            ratios.append(case_s / cold_s)
            results.append(result[0])
    return statistics.median(ratios), results


class PassThrough:
    """A listener that wants every file and never acts: the cost of the wrapper itself."""

    def wants(self, relative):
        return True

    def on_open(self, file):
        pass

    def on_write(self, file, data, nbytes):
        pass

    def on_fsync(self, file):
        pass

    def before_close(self, file):
        pass

    def after_close(self, file):
        pass


def bench_interception(repeats: int, size_mib: int) -> tuple[float, float]:
    """Throughput ratios vs torch.save to a plain path: (layer installed, no fault armed),
    (every write routed through the wrapper with a listener that never fires)."""
    import torch

    from resilience.disk.interception import Interceptor

    state = {f"t{i}": torch.randn(size_mib * (1 << 20) // 4 // 8) for i in range(8)}
    idle, wrapped = [], []
    with tempfile.TemporaryDirectory(prefix="resilience-bench-") as tmp:
        plain, root = Path(tmp) / "plain.pt", Path(tmp) / "intercepted"
        root.mkdir()
        for _ in range(repeats):
            for listeners, ratios in (([], idle), ([PassThrough()], wrapped)):
                plain_s = timed(lambda: torch.save(state, plain))
                interceptor = Interceptor(root, listeners)
                interceptor.install()
                try:
                    intercepted_s = timed(lambda: torch.save(state, root / "x.pt"))
                finally:
                    interceptor.uninstall()
                ratios.append(plain_s / intercepted_s)
                plain.unlink()
                (root / "x.pt").unlink()
    return statistics.median(idle), statistics.median(wrapped)


def random_kill_case(rng: random.Random):
    rank = rng.randrange(2)
    point = rng.choice(["start", "open", "write", "close"])
    fault = {"kind": "kill", "rank": rank, "step": rng.choice([4, 8]), "point": point}
    if point != "start":
        fault["file"] = f"*_rank_{rank}.pt"
    if point == "write":
        fault["after_bytes"] = rng.randrange(1, 200_000)
    document = {"name": "fuzz example", "description": "drawn at random", "strategy": "torch.per_rank",
                "workload": {"world_size": 2, "steps": 8, "checkpoint_every": 4},
                "fault": fault, "expect": "recovers"}
    return load_document(document, "benchmark").cases[0]


def examples_per_minute(harness: Harness, examples: int, seed: int) -> float:
    rng = random.Random(seed)
    cases = [random_kill_case(rng) for _ in range(examples)]
    harness.run(cases[0])  # warm-up, not counted
    elapsed = timed(lambda: [harness.run(c) for c in cases])
    return examples / elapsed * 60


def cpu_jiffies() -> tuple[int, int]:
    """The machine's busy and total CPU time so far (all cores, /proc/stat's first line)."""
    user, nice, system, idle, iowait, irq, softirq = map(int, Path("/proc/stat").read_text().split()[1:8])
    return user + nice + system + irq + softirq, user + nice + system + idle + iowait + irq + softirq


def suite_seconds(extra: list[str], cache: Path) -> tuple[float, dict[str, str]]:
    """Wall time of the shipped suite, and each case's verdict by its id (from pytest's junit XML,
    where the plugin records it as a property)."""
    with tempfile.TemporaryDirectory(prefix="resilience-bench-junit-") as scratch:
        junit = Path(scratch) / "suite.xml"
        command = [sys.executable, "-m", "pytest", str(ROOT / "scenarios"), "-q", "-p", "no:cacheprovider",
                   f"--resilience-cache={cache}", f"--junitxml={junit}", *extra]
        elapsed = timed(lambda: subprocess.run(command, cwd=ROOT, capture_output=True, text=True))
        verdicts = {}
        for case in ET.parse(junit).getroot().iter("testcase"):
            verdict = next((p.get("value") for p in case.iter("property") if p.get("name") == "verdict"), None)
            verdicts[f"{case.get('classname')}::{case.get('name')}"] = verdict or "(no verdict: skipped or error)"
    return elapsed, verdicts


def bench_restores(cache: ReferenceCache, strategy: str = "torch.per_rank") -> tuple[float, float]:
    """(f) and (g): the explorer's restores timed one by one, in warm ranks and then in fresh ones."""
    from resilience.run import crash_restores

    spent: dict[str, list[float]] = {"warm": [], "fresh": []}
    original = crash_restores.CrashRestores.restore

    def timed_restore(self, files, dirs, digest, fresh=False):
        started = time.monotonic()
        try:
            return original(self, files, dirs, digest, fresh)
        finally:
            spent["fresh" if fresh or self.pool is None else "warm"].append(time.monotonic() - started)

    crash_restores.CrashRestores.restore = timed_restore
    try:
        case = next(c for c in load_file(POWER_LOSS).cases if c.strategy.name == strategy)
        warm = Harness(cache=cache)
        warm.run(load_file(NO_FAULT).cases[0])  # the fork server's start, not counted
        wall = timed(lambda: warm.run(case))
        warm_each = statistics.mean(spent["warm"])
        states = len(spent["warm"])
        spent["fresh"].clear()
        Harness(backend=warm.backend, cache=cache, explore_warm=False).run(case)
        fresh_each = statistics.mean(spent["fresh"])
    finally:
        crash_restores.CrashRestores.restore = original
    print(f"(f) crash-state restores per second, warm ranks / fresh forked ranks ({strategy} power loss): "
          f"{fresh_each / warm_each:.1f}x ({1 / warm_each:.1f} vs {1 / fresh_each:.1f} per second; goal >= 10x)",
          flush=True)
    print(f"(g) that power-loss case's wall time / ({states} warm restores x one warm restore): "
          f"{wall / (states * warm_each):.2f} (goal <= 1.5; {wall:.1f} s)", flush=True)
    return fresh_each / warm_each, wall / (states * warm_each)


def print_suite_ratio(cache_dir: Path) -> None:
    suite_seconds(["-n", "2"], cache_dir)  # fills the reference cache: both runs below find it warm
    busy_before, total_before = cpu_jiffies()
    serial, serial_verdicts = suite_seconds([], cache_dir)
    busy_after, total_after = cpu_jiffies()
    busy = (busy_after - busy_before) / max(total_after - total_before, 1)
    parallel, parallel_verdicts = suite_seconds(["-n", "2"], cache_dir)
    cases = len(serial_verdicts)
    differ = sorted(case for case in serial_verdicts.keys() | parallel_verdicts.keys()
                    if serial_verdicts.get(case) != parallel_verdicts.get(case))
    print(f"(d) shipped suite wall time, -n 2 / serial, warm reference cache: {parallel / serial:.2f} "
          f"(goal <= 0.6; {serial / max(cases, 1):.2f} s per case serial, {parallel / max(cases, 1):.2f} "
          f"with -n 2, {cases} cases); verdicts differ for {len(differ)} case ids (goal 0); the serial "
          f"run kept {busy:.2f} of the machine's {os.cpu_count()} cores busy, so -n 2 cannot go below "
          f"{max(busy, 0.5):.2f} without less CPU per case", flush=True)
    for case in differ:
        print(f"    {case}: serial {serial_verdicts.get(case)}, -n 2 {parallel_verdicts.get(case)}", flush=True)


def print_deepspeed_ratio(harness: Harness, repeats: int) -> None:
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        print("(e) skipped: deepspeed is not installed", flush=True)
        return
    cases = load_file(DEEPSPEED).cases
    index = next(i for i, c in enumerate(cases) if c.strategy.name == "deepspeed.zero2" and c.fault.kind == "kill")
    ratio, _ = bench_case_vs_torchrun(harness, repeats, DEEPSPEED, index)
    print(f"(e) DeepSpeed ZeRO-2 kill case end to end (first run, kill, restart, verify) / one cold "
          f"torchrun launch of the same DeepSpeed training: {ratio:.2f} (median of {repeats})", flush=True)


def print_blackbox_ratio(repeats: int) -> None:
    """(h): a black-box case of the example script (rank 1 killed at step 6, torchrun restarts the
    group), its references cached, against the faulted job's own torchrun launches in that case."""
    from resilience.core.directory_cache import DirectoryCache
    from resilience.run.blackbox import BlackBoxJob, qualify_script

    job = BlackBoxJob(script=EXAMPLE_SCRIPT, args=("--checkpoint-dir", "{checkpoint_dir}"))
    fault = {"kind": "kill", "rank": 1, "step": 6}
    with tempfile.TemporaryDirectory(prefix="resilience-bench-scripts-") as directory:
        cache = DirectoryCache(Path(directory))
        qualify_script(job, fault, cache=cache)  # the two uninterrupted references, cached
        ratios, launches = [], []
        for _ in range(repeats):
            started = time.monotonic()
            result = qualify_script(job, fault, cache=cache)
            whole = time.monotonic() - started
            launches.append(sum(seconds for _, seconds in result.job_launches_s))
            ratios.append(whole / launches[-1])
    print(f"(h) black-box case with its references cached / the faulted job's torchrun launches alone: "
          f"{statistics.median(ratios):.2f} (goal <= 1.3; median of {repeats}; launches "
          f"{statistics.median(launches):.1f} s, {len(result.job_launches_s)} per case)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["d", "e", "f", "h"], help="run one measurement only (f: also g)")
    args = parser.parse_args()
    end_like_ctrl_c_on_sigterm()  # stopped by `timeout`: the cache and pymp-* directories still go
    repeats = 2 if args.quick else 4
    with tempfile.TemporaryDirectory(prefix="resilience-bench-cache-") as cache_dir:
        cache = ReferenceCache(Path(cache_dir))
        fork = Harness(backend=BACKENDS["fork"](), cache=cache)
        spawn = Harness(backend=BACKENDS["spawn"](), cache=cache)

        if args.only == "e":
            print_deepspeed_ratio(fork, repeats)
            return 0
        if args.only == "f":
            bench_restores(cache)
            return 0
        if args.only == "d":
            print_suite_ratio(Path(cache_dir))
            return 0
        if args.only == "h":
            print_blackbox_ratio(repeats)
            return 0
        ratio_a, results = bench_case_vs_torchrun(fork, repeats)
        harness_peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before (b)'s 512 MiB
        print(f"(a) 2-rank no-fault case end to end / cold torchrun of the same training: {ratio_a:.2f} "
              f"(goal <= 0.5; median of {repeats})", flush=True)
        idle, wrapped = bench_interception(repeats + 1, 512)
        print(f"(b) 512 MiB torch.save throughput / plain path: {idle:.2f} with the interception layer "
              f"installed and no fault armed (goal >= 0.9); {wrapped:.2f} with every write routed "
              f"through the wrapper (median of {repeats + 1})", flush=True)
        examples = 3 if args.quick else 6
        fast, slow = examples_per_minute(fork, examples, 1), examples_per_minute(spawn, examples, 1)
        print(f"(c) fuzz examples per minute, fork / spawn backend: {fast / slow:.1f}x "
              f"({fast:.0f} vs {slow:.0f} per minute, {examples} examples each)", flush=True)
        print_suite_ratio(Path(cache_dir))
        bench_restores(cache)

        print_deepspeed_ratio(fork, repeats)
        print_blackbox_ratio(repeats)
        rank_peaks = [e["peak_rss_kib"] for r in results for p in r.phases for rec in p.ranks
                      for e in rec.events if e["event"] == "done"]
        print(f"peak memory running cases: harness {harness_peak_mib:.0f} MiB, "
              f"largest rank {max(rank_peaks) / 1024:.0f} MiB", flush=True)
        case = load_file(NO_FAULT).cases[0]
        samples = []
        for index in range(1, 21):
            fork.run(case)
            if index in (1, 10, 20):
                samples.append((index, rss_kib() / 1024, len(os.listdir("/proc/self/fd"))))
        print("harness after N cases (N, RSS MiB, open fds): "
              + ", ".join(f"({n}, {m:.0f}, {f})" for n, m, f in samples), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
