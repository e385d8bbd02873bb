"""``streambatch demo``: write, index and stream a small corpus, and say what happened.

Ranks are simulated in one process, one after the other: rank ``r`` of ``W``
is ``StreamingBatches(..., rank=r, world_size=W)`` read through its own
DataLoader, exactly what each process of a DDP job runs (planning needs no
communication, so nothing else differs).
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from ..core.redact import scrub
from ..core.units import seconds_to_frames
from .args import Formatter, add_plan_args, whole

FPS = 50  # planning frames per second of audio: lengths are ceil(duration * 50)


def run_demo(args: argparse.Namespace) -> int:
    from .metrics import quality, rank_batches
    from .report import format_quality

    if args.dir:
        check_demo_dir(args.dir, args.force)
    w, t_budget = args.world_size, args.max_batch_tokens
    print(f"streambatch demo: {args.shards} shards x {args.samples_per_shard} utterances, {w} simulated ranks x "
          f"{args.workers} DataLoader workers, planner {args.planner}, budget {t_budget:,} frames "
          f"({t_budget / FPS:g} s of audio at {FPS} frames/s), at most {args.max_batch_size} per batch\n")
    out_dir = args.dir or tempfile.mkdtemp(prefix="streambatch-demo-")
    try:
        paths, num_samples, fmt = _write_and_index(args, out_dir)
        per_rank, keys, first, total_s, ds = _stream_every_rank(args, paths, fmt)
        summary = ds.epoch_summary()
        rows = planner_rows(ds, args)
    finally:
        if not args.dir:
            shutil.rmtree(out_dir, ignore_errors=True)

    steps = {len(r) for r in per_rank}
    distinct = len(set(keys))
    print(f"\n  every rank took {'the same' if len(steps) == 1 else 'DIFFERENT'} number of steps "
          f"({', '.join(str(len(r)) for r in per_rank)}); {distinct:,} of {num_samples:,} utterances delivered, "
          f"{len(keys) - distinct} repeated (the final step's padding: {summary.padded})")
    print(f"  {len(keys):,} samples in {total_s:.1f} s: {len(keys) / total_s:,.0f} samples/s "
          f"(ranks one after the other in this process; each rank of a real job runs in parallel)\n")
    streamed = quality(rank_batches(per_rank), t_budget)
    print("\n".join(format_quality(streamed)))
    print_planner_rows(rows, streamed, args, num_samples)
    if first is not None:
        shape = "x".join(str(d) for d in first["audio"].shape)
        print(f"\n  a batch: audio {str(first['audio'].dtype).replace('torch.', '')} [{shape}] at "
              f"{first['sample_rate']} Hz, audio_lengths, keys, json (durations, texts)")
    _print_next(args)
    return 0 if len(steps) == 1 else 1


def _write_and_index(args: argparse.Namespace, out_dir: str) -> tuple[list[str], int, str]:
    """Steps 1 and 2: write the shards and their sidecars. Returns (shard paths, samples, audio format)."""
    from ..streaming import index_shards
    from .corpus import has_soundfile, make_shards
    from .report import audio_time

    t = time.perf_counter()
    # FLAC with soundfile (the audio extra); WAV, which the base install writes and decodes, without it
    fmt = "flac" if has_soundfile() else "wav"
    paths = make_shards(out_dir, args.shards, args.samples_per_shard, args.seed, speech=args.speech, audio_format=fmt)
    size = sum(os.path.getsize(p) for p in paths)
    print(f"[1/3] wrote {len(paths)} WebDataset shards ({size / 2**20:.1f} MiB of {fmt.upper()} + JSON, "
          f"{args.speech} speech) to {out_dir} in {time.perf_counter() - t:.1f} s")
    s = index_shards(paths, length_from="json:duration", frames_per_second=FPS,
                     workers=min(2, os.cpu_count() or 1), progress=False, force=True)
    p = s.percentiles
    print(f"[2/3] indexed them in {s.seconds:.1f} s: {s.samples:,} utterances, "
          f"{audio_time(s.total_length / FPS)}; length (frames) min {p['min']}, median {p['p50']}, "
          f"p95 {p['p95']}, max {p['max']}")
    print(f"      sidecars: {scrub(os.path.basename(paths[0]))}.idx.npz ... (keys, lengths, byte offsets)")
    return paths, s.samples, fmt


def _stream_every_rank(args: argparse.Namespace, paths: list[str], fmt: str):
    """Step 3: each simulated rank streams its epoch through its own DataLoader.

    Returns (per-rank batch lengths, keys delivered, the first batch, seconds, the last rank's dataset).
    """
    from torch.utils.data import DataLoader

    from ..streaming import StreamingBatches, collate_audio

    print(f"[3/3] streaming with StreamingBatches -> DataLoader(num_workers={args.workers}), decoding {fmt.upper()} "
          "and padding each batch into a tensor\n")
    print("  rank  steps  samples  audio (min)  seconds  samples/s")
    per_rank: list[list[np.ndarray]] = []
    keys: list[str] = []
    first = None
    total_s = 0.0
    for rank in range(args.world_size):
        ds = StreamingBatches(paths, args.max_batch_tokens, args.max_batch_size, rank=rank,
                              world_size=args.world_size, planner=args.planner, seed=args.seed, decode="audio",
                              collate_fn=collate_audio, verify=False, **dict(args.planner_option))
        loader = DataLoader(ds, batch_size=None, num_workers=args.workers)
        t = time.perf_counter()
        lengths, n, audio_s = [], 0, 0.0
        for batch in loader:
            # The planner's own units: the frame count the sidecar holds for each sample.
            lengths.append(seconds_to_frames(np.array([m["duration"] for m in batch["json"]]), FPS))
            keys.extend(batch["keys"])
            n += len(batch["keys"])
            audio_s += float(batch["audio_lengths"].sum()) / batch["sample_rate"]
            if first is None:
                first = batch
        dt = time.perf_counter() - t
        total_s += dt
        per_rank.append(lengths)
        print(f"  {rank:>4}  {len(lengths):>5}  {n:>7,}  {audio_s / 60:>11.1f}  {dt:>7.1f}  {n / dt:>9,.0f}")
    return per_rank, keys, first, total_s, ds


def _print_next(args: argparse.Namespace) -> None:
    print("\nnext:")
    print("  your lengths   streambatch plan cuts.jsonl.gz --frames-per-second 50 --max-batch-tokens 16000 "
          "--world-size 8")
    print("  your shards    streambatch index 'train-{000000..000999}.tar' --frames-per-second 50")
    print("  training       StreamingBatches(urls, max_batch_tokens=16000, decode='audio', collate_fn=collate_audio)")
    print("                 in DataLoader(ds, batch_size=None, num_workers=4), "
          "or DynamicBatchSampler for map-style data")
    print("  speed          streambatch bench --sizes 1e6 1e7 4e7 --worlds 8 64 512")
    if args.dir:
        print(f"  this corpus    kept in {args.dir}: try streambatch plan {args.dir} --max-batch-tokens "
              f"{args.max_batch_tokens} --world-size {args.world_size}")


def check_demo_dir(path: str, force: bool) -> None:
    """Refuse to write the demo corpus over files the user may want, unless --force."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, "--dir must name a directory", path)
    if os.path.isdir(path) and os.listdir(path) and not force:
        raise FileExistsError(errno.EEXIST, "--dir is not empty; the demo writes demo-000000.tar ... and their "
                              "sidecars there: pass a new or empty directory, or --force to overwrite them", path)


def planned_batches(catalog, config, epoch: int = 0):
    """Batches (see ``metrics.Batches``) of the epoch StreamingBatches streams
    with ``config``, planned window by window from the sidecar lengths alone."""
    from ..epoch.read_modes import iter_windows
    from .metrics import Batches, plan_batches

    parts = []
    for win in iter_windows(catalog.counts, catalog.lengths, config, epoch):
        lens = np.empty(win.shard_ids.size, dtype=np.int64)
        for shard in np.unique(win.shard_ids).tolist():
            here = win.shard_ids == shard
            lens[here] = catalog.lengths(shard)[win.local[here]]
        parts.append(plan_batches(win.plan, lens))
    return Batches(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("sizes", "longest", "real")))


def planner_rows(ds, args: argparse.Namespace) -> list:
    """(name, Quality) of the epoch each planner would stream, planned from the sidecars (no audio read)."""
    from ..planners import PLANNERS
    from .metrics import quality

    return [(name, quality(planned_batches(ds.catalog, _config_for(ds.config, name)), args.max_batch_tokens))
            for name in sorted(PLANNERS)]


def _config_for(config, name: str):
    """The streamed configuration with another planner (its own options only for the chosen one)."""
    return config if name == config.planner else config.replace(planner=name, planner_options={})


def print_planner_rows(rows: list, streamed, args: argparse.Namespace, num_samples: int) -> None:
    print("\n  the same epoch planned by each planner from the sidecars alone (no audio read; --planner P to switch):")
    print("    planner       steps  padding  balance  budget use")
    for name, q in rows:
        mark = ""
        if name == args.planner:
            same = all(np.isclose(v, streamed.as_dict()[k]) for k, v in q.as_dict().items())
            mark = " <- streamed above" + ("" if same else " (DIFFERS from what was streamed)")
        print(f"    {name:<12} {q.steps:>6}  {q.padding_efficiency:>7.3f}  {q.balance_efficiency:>7.3f}  "
              f"{q.budget_use:>10.3f}{mark}")
    if any(name == "greedy" for name, _ in rows) and num_samples < 4096:
        print("    (greedy, the seed sampler's algorithm, shuffles within chunks of 512 length-sorted samples: on a "
              "corpus this small\n     that mixes lengths almost at random; on large corpora it pads less)")


def add_parser(sub: Any, planners: list[str], recommended: str) -> None:
    d = sub.add_parser("demo", formatter_class=Formatter, help="write, index and stream a small demo corpus",
                       description=(
        "Write a small corpus of audio shards (generated pseudo-speech, or espeak-ng speech with\n"
        "--speech espeak), index it, and stream it with StreamingBatches for --world-size simulated\n"
        "ranks in this process, each through a DataLoader with --workers workers. Prints steps per\n"
        "rank, padding and balance efficiency and samples/s. Takes well under a minute."))
    d.add_argument("--dir", metavar="DIR",
                   help="write the corpus here and keep it (default: a temporary directory, removed after)")
    d.add_argument("--force", action="store_true", help="with --dir: write into DIR even if it is not empty "
                   "(its demo-*.tar shards and sidecars are overwritten)")
    d.add_argument("--shards", type=whole(1), default=8, metavar="N", help="shards to write")
    d.add_argument("--samples-per-shard", type=whole(1), default=50, metavar="N", help="utterances per shard")
    d.add_argument("--workers", type=whole(0), default=2, metavar="N", help="DataLoader workers per rank")
    d.add_argument("--speech", choices=("generated", "espeak", "auto"), default="generated",
                   help="audio: generated pseudo-speech (fast), espeak-ng speech, or espeak-ng when installed")
    add_plan_args(d, planners, tokens=2000, world=2, planner=recommended, seed=0,
                  tokens_help="token budget per batch, in frames (50 frames/s: 2000 = 40 s of audio)",
                  world_help="simulated ranks", seed_help="corpus and planning seed")
    d.set_defaults(run=("demo", "run_demo"))
