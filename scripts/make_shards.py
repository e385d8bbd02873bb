#!/usr/bin/env python
"""Write a demo corpus of WebDataset audio shards (see streambatch.cli.corpus).

    python scripts/make_shards.py data/demo --shards 8 --samples-per-shard 100 --index

then stream it with ``StreamingBatches("data/demo/demo-{000000..000007}.tar", ...)``.
"""

from __future__ import annotations

import argparse
import os

from streambatch.cli.corpus import make_shards
from streambatch.streaming import index_shards


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples-per-shard", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-rate", type=int, default=16000)
    p.add_argument("--format", choices=("flac", "wav"), default="flac")
    p.add_argument("--speech", choices=("auto", "espeak", "generated"), default="auto")
    p.add_argument("--index", action="store_true", help="also write sidecars (lengths: json duration x 50 frames/s)")
    a = p.parse_args(argv)
    paths = make_shards(a.out_dir, a.shards, a.samples_per_shard, a.seed, sample_rate=a.sample_rate,
                        audio_format=a.format, speech=a.speech)
    print(f"wrote {len(paths)} shards to {a.out_dir}: {os.path.basename(paths[0])} .. {os.path.basename(paths[-1])}")
    if a.index:
        print(index_shards(paths, length_from="json:duration", frames_per_second=50))


if __name__ == "__main__":
    main()
