"""``streambatch index``: write the sidecar indexes ``StreamingBatches`` reads."""

from __future__ import annotations

import argparse
import sys

from .plan import shard_list
from .report import audio_time
from typing import Any

from .args import Formatter, positive_float, whole



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


def add_parser(sub: Any) -> None:
    ix = sub.add_parser("index", formatter_class=Formatter, help="write sidecar indexes of WebDataset shards",
                        description=(
        "Write a sidecar index (<shard>.idx.npz: keys, lengths, byte offsets) for every shard that\n"
        "lacks a current one, in parallel, without decoding audio. StreamingBatches and\n"
        "`streambatch plan` read them.\n\n"
        "examples:\n"
        "  streambatch index 'data/train-{000000..000999}.tar' --frames-per-second 50\n"
        "  streambatch index data/*.tar --length-from audio --frames-per-second 100"))
    ix.add_argument("shards", nargs="+", metavar="SHARD", help="shard paths, brace patterns, URLs or directories of .tar shards")
    ix.add_argument("--length-from", default="json:duration", metavar="SOURCE",
                    help="json:FIELD (a field of the .json member), audio (header of the first audio member) "
                         "or audio:SUFFIX")
    ix.add_argument("--frames-per-second", "--fps", type=positive_float, metavar="FPS",
                    help="the value is seconds: length = ceil(seconds x this)")
    ix.add_argument("--index-dir", metavar="DIR", help="write sidecars here (required for remote shards; default: next to each shard)")
    ix.add_argument("--workers", type=whole(1), metavar="N", help="processes scanning shards (default: CPU count)")
    ix.add_argument("--force", action="store_true", help="re-index shards whose sidecar is current")
    ix.add_argument("--no-progress", action="store_true", help="no progress bar")
    ix.set_defaults(run=("index", "run_index"))
