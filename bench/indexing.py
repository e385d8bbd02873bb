"""What the full-content shard digest costs: ``index_shards`` with it (the
default since issue 11) against the header-only scan without it, and opening
a ``StreamingBatches`` with ``verify="full"`` against the cheap stat check.
Ratios in one process, runs interleaved, best of --repeats, warm page cache
(a cold cache adds one sequential read of every shard to both "with" runs).

    .venv/bin/python bench/indexing.py             # the demo corpus of bench/streaming.py (~30 s)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from unittest import mock

from streambatch.cli.corpus import make_shards
from streambatch.streaming import StreamingBatches, index_shards
from streambatch.streaming.shards import identity as shard_identity


def corpus(out: str, shards: int, per_shard: int) -> list[str]:
    d = os.path.join(out, f"demo-{shards}x{per_shard}")
    paths = [os.path.join(d, f"demo-{i:06d}.tar") for i in range(shards)]
    if not all(os.path.exists(p) for p in paths):
        make_shards(d, shards, per_shard, seed=0, sample_rate=16000, median_seconds=2.0, speech="generated")
    return paths


def best_of(repeats: int, runs: dict) -> dict[str, float]:
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/streambatch-bench")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--per-shard", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    paths = corpus(a.out, a.shards, a.per_shard)
    total = sum(os.path.getsize(x) for x in paths)
    print(f"# index / open cost of the content digest (python {sys.version.split()[0]}, {os.cpu_count()} CPUs); "
          f"{len(paths)} shards, {total / 1e6:.0f} MB")
    for length_from in ("json:duration", "audio"):
        def index(length_from=length_from):
            index_shards(paths, length_from=length_from, frames_per_second=50, workers=1, progress=False, force=True)

        def index_without_digest(index=index):
            with mock.patch.object(shard_identity, "content_digest", lambda url: ""):
                index()

        t = best_of(a.repeats, {"with digest": index, "header-only": index_without_digest})
        print(f"  index --length-from {length_from:13s}: {t['with digest']:.3f} s with the digest, "
              f"{t['header-only']:.3f} s without: ratio {t['with digest'] / t['header-only']:.2f} "
              f"({total / 1e6 / (t['with digest'] - t['header-only']):.0f} MB/s hashed)")
    index_shards(paths, frames_per_second=50, workers=1, progress=False, force=True)

    def open_stat():
        StreamingBatches(paths, 16000, 64, rank=0, world_size=1, verify=False)

    def open_full():
        StreamingBatches(paths, 16000, 64, rank=0, world_size=1, verify="full")

    open_stat()  # load the planner once
    t = best_of(a.repeats, {"stat": open_stat, "full": open_full})
    print(f"  open StreamingBatches: {t['stat']:.3f} s (size/mtime check), {t['full']:.3f} s (verify='full'): "
          f"ratio {t['full'] / t['stat']:.1f}")


if __name__ == "__main__":
    main()
