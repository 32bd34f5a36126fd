"""Effect of torch.per_rank's `stagger: K` (ranks write in waves of K, a barrier between waves) on
save and restore throughput, as ratios measured side by side in one run (never absolute times).

    python benchmarks/stagger.py                       # 4 ranks, 16 MiB model, 3 repetitions
    python benchmarks/stagger.py --dir /mnt/shared/ckpt --world-size 8 --size 64MiB

For each K: the median save time over the repetitions relative to unstaggered saves, and save and
restore throughput as fractions of the directory's raw sequential write+fsync bandwidth (measured
in the same run). On one local disk waves only serialize the writes; on a shared filesystem
saturated by many writers they can shorten the slowest rank's save.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# the checkout's package, not an installed one: imported once the path is set (E402)
from resilience.launch.backend import BACKENDS  # noqa: E402
from resilience.measure.fsprobe import measure_write_bandwidth  # noqa: E402
from resilience.measure.throughput import measure  # noqa: E402
from resilience.run.harness import Harness  # noqa: E402
from resilience.scenario.loader import parse_size  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="checkpoint filesystem to measure (default: temp dir)")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--size", default="16MiB", help="model parameter bytes")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = parse_size(args.size)
    with tempfile.TemporaryDirectory(prefix="resilience-stagger-", dir=args.dir) as root:
        target = Path(root)
        harness = Harness(backend=BACKENDS["fork"](), work_root=target, keep=True, cache=None)
        waves = [None] + sorted({k for k in (args.world_size // 2, 1) if 0 < k < args.world_size}, reverse=True)
        runs: dict[int | None, list] = {k: [] for k in waves}
        raw = []
        for _ in range(args.repeats):  # interleaved, so drifting load on shared cores hits every K alike
            raw.append(measure_write_bandwidth(target, 128 << 20).bytes_per_s)
            for k in waves:
                options = {"stagger": k} if k else {}
                runs[k].append(measure(harness, "torch.per_rank", options, f"stagger {k}", size,
                                       args.world_size, raw[-1]))
    base = statistics.median(f.save_s for f in runs[None])
    print(f"torch.per_rank, {args.world_size} ranks, {runs[None][0].bytes_per_checkpoint >> 20} MiB per checkpoint, "
          f"median of {args.repeats}; raw write+fsync {statistics.median(raw) / 1e6:.0f} MB/s")
    print(f"{'waves of':<10} {'save time / unstaggered':>24} {'save / raw':>11} {'restore / raw':>14}")
    for k in waves:
        figures = runs[k]
        save = statistics.median(f.save_s for f in figures)
        print(f"{('all' if k is None else k):<10} {save / base:>24.2f} "
              f"{statistics.median(f.save_fraction for f in figures):>11.2f} "
              f"{statistics.median(f.restore_fraction for f in figures):>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
