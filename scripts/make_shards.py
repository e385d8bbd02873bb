#!/usr/bin/env python
"""Write a demo corpus of WebDataset audio shards (see streambatch.cli.corpus).

    python scripts/make_shards.py data/demo --shards 8 --samples-per-shard 100 --index

then stream it with ``StreamingBatches("data/demo/demo-{000000..000007}.tar", ...)``.
Progress goes to stderr, one line per shard (a bar with tqdm installed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from streambatch.cli.corpus import has_soundfile, make_shards
from streambatch.streaming import index_shards


class Progress:
    """``progress(done, total)`` for make_shards: a tqdm bar on a terminal, else plain lines."""

    def __init__(self, total: int, what: str):
        self.t0 = time.perf_counter()
        self.what = what
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="shard", desc=what, file=sys.stderr)
            except ImportError:
                pass

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            if done == total:
                self.bar.close()
            return
        dt = time.perf_counter() - self.t0
        left = dt / done * (total - done)
        print(f"{self.what}: {done}/{total} shards, {dt:.0f} s, about {left:.0f} s left", file=sys.stderr,
              flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples-per-shard", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-rate", type=int, default=16000)
    p.add_argument("--format", choices=("flac", "wav"), default=None,
                   help="audio format (default: flac when soundfile is installed, else wav)")
    p.add_argument("--speech", choices=("auto", "espeak", "generated"), default="auto")
    p.add_argument("--index", action="store_true", help="also write sidecars (lengths: json duration x 50 frames/s)")
    a = p.parse_args(argv)
    fmt = a.format or ("flac" if has_soundfile() else "wav")
    paths = make_shards(a.out_dir, a.shards, a.samples_per_shard, a.seed, sample_rate=a.sample_rate,
                        audio_format=fmt, speech=a.speech, progress=Progress(a.shards, f"writing {fmt} shards"))
    print(f"wrote {len(paths)} shards to {a.out_dir}: {os.path.basename(paths[0])} .. {os.path.basename(paths[-1])}")
    if a.index:
        print(index_shards(paths, length_from="json:duration", frames_per_second=50))


if __name__ == "__main__":
    main()
