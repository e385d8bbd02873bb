"""``streambatch index``: write the sidecar indexes ``StreamingBatches`` reads."""

from __future__ import annotations

import argparse
import sys

from .plan import shard_list
from .report import audio_time



def run_index(args: argparse.Namespace) -> int:
    from ..streaming import index_shards

    shards = [u for text in args.shards for u in shard_list(text)]
    s = index_shards(shards, length_from=args.length_from, frames_per_second=args.frames_per_second,
                     index_dir=args.index_dir, workers=args.workers,
                     progress=not args.no_progress and sys.stderr.isatty(), force=args.force)
    fps = args.frames_per_second
    sec = (lambda v: f" ({v / fps:.1f} s)") if fps else (lambda v: "")
    where = f"in {args.index_dir}" if args.index_dir else "next to the shards"
    print(f"{s.shards:,} shards: {s.indexed:,} indexed, {s.current:,} already current ({s.seconds:.1f} s); "
          f"sidecars {where}")
    print(f"  samples          {s.samples:,}")
    total = f"{s.total_length:,}"
    if fps:
        total += f" frames = {audio_time(s.total_length / fps)}"
    print(f"  total length     {total}")
    if s.percentiles:
        print("  length           " + ", ".join(f"{k} {v:,}{sec(v)}" for k, v in s.percentiles.items()))
    pattern = args.shards[0] if len(args.shards) == 1 else "SHARDS..."
    flags = f" --index-dir {args.index_dir}" if args.index_dir else ""  # the sidecars tell plan the frame rate
    print(f"next: streambatch plan '{pattern}'{flags} --max-batch-tokens 16000 --world-size 8")
    return 0
