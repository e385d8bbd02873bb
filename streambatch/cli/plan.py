"""``streambatch plan``: lengths in, a quality report out.

INPUTs are lengths files and manifests (``streambatch.manifest``) or indexed
WebDataset shards (their sidecars' lengths); the plan is ``make_plan``'s and
the report is ``streambatch.report``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from typing import Any

import numpy as np

from ..core.units import seconds_to_frames
from .args import Formatter, add_plan_args, length_limit, positive_float, whole
from .report import audio_time

_BRACES = re.compile(r"\{\d+\.\.\d+\}")
_SHARD_EXT = (".tar", ".tar.gz", ".tgz")


def is_shards(text: str) -> bool:
    """Does an INPUT name WebDataset shards (rather than a lengths file)?"""
    if text.startswith("pipe:") or "://" in text or text.endswith(_SHARD_EXT) or _BRACES.search(text):
        return True
    # a directory: the shards under it, if it holds any
    return os.path.isdir(text) and any(n.endswith(_SHARD_EXT) for _, _, names in os.walk(text) for n in names)


def shard_list(text: str) -> list[str]:
    """The shards an INPUT names: a directory gives every .tar file under it (its
    subdirectories too), in path order; anything else is one shard or pattern."""
    if os.path.isdir(text):
        from ..streaming.io.urls import shards_under

        try:
            return shards_under(text)
        except ValueError as exc:
            raise ValueError(f"{exc}; or a lengths file (.npy, text, .jsonl)") from None
    return [text]


def load_inputs(inputs: list[str], field: str | None, fps: float | None, index_dir: str | None,
                fmt: str | None = None) -> tuple[np.ndarray, str, float | None]:
    """(N,) int64 lengths of all inputs in order, where they came from, and
    frames per second (given, or read from the shards' sidecars) or None.
    Corpora of other formats (Shar, NeMo, Parquet: ``formats.py``) plan from their own metadata."""
    from .formats import corpus_lengths, corpus_of
    from .manifest import read_lengths

    parts, names = [], []
    corpora = {text: found for text in inputs if (found := corpus_of(text, fmt)) is not None}
    for text, found in corpora.items():
        lens, name = corpus_lengths(text, found, field, fps)
        parts.append(lens)
        names.append(name)
    inputs = [text for text in inputs if text not in corpora]
    shards = [s for text in inputs if is_shards(text) for s in shard_list(text)]
    files = [text for text in inputs if not is_shards(text)]
    if shards:
        from ..streaming import open_catalog
        from ..streaming.shards.sidecar import read_meta

        hint = inputs[0] if len(inputs) == 1 else None
        cat = open_catalog(shards, index_dir=index_dir, url_hint=hint)
        # Sidecars record how their lengths were made ("json:duration*50/s"):
        # that gives the frame rate, and --field/--fps are checked against it.
        source, _, rate = read_meta(cat.sidecars[0])["length_from"].partition("*")
        indexed_fps = float(rate[:-2]) if rate.endswith("/s") else None
        wanted = f"json:{field}" if field else source
        if wanted != source or (fps and fps != indexed_fps):
            if wanted.startswith("fn:"):
                raise ValueError(f"{cat.urls[0]} was indexed with a Python function ({source}); --frames-per-second "
                                 "cannot be checked against it: drop it, or re-index with `streambatch index --force`")
            # raises, naming the `streambatch index --force ...` command that re-indexes
            cat = open_catalog(shards, index_dir=index_dir, length_from=wanted,
                               frames_per_second=fps or indexed_fps, url_hint=hint)
        fps = fps or indexed_fps
        parts.append(np.concatenate([cat.lengths(i) for i in range(len(cat.urls))]))
        names.append(f"{len(cat.urls)} indexed shard{'s' * (len(cat.urls) != 1)}")
    for path in files:
        parts.append(read_lengths(path, field=field, frames_per_second=fps))
        names.append(os.path.basename(path))
    how = f" ({fps:g} frames/s)" if fps else ""
    return np.concatenate(parts), ", ".join(names) + how, fps


def parse_mix(specs: list[str]) -> list[tuple[str, str, float]]:
    """``INPUT:WEIGHT`` or ``INPUT:xREPEAT`` -> (input, "weight" | "repeat", value)."""
    out = []
    for spec in specs:
        text, sep, value = spec.rpartition(":")
        kind = "repeat" if value[:1] in "xX" else "weight"
        try:
            v = float(value[1:] if kind == "repeat" else value)
        except ValueError:
            v = float("nan")
        if not sep or not text or not np.isfinite(v) or v < 0:
            raise ValueError(f"--mix takes INPUT:WEIGHT or INPUT:xREPEAT (e.g. a.jsonl:0.6 or clean.npy:x3), "
                             f"got {spec!r}")
        out.append((text, kind, v))
    kinds = {k for _, k, _ in out}
    if len(kinds) > 1:
        raise ValueError("--mix: give every source a weight (a.npy:0.6 b.npy:0.4) or every source a repeat factor "
                         "(a.npy:x1 b.npy:x3), not both")
    return out


def load_mix(args: argparse.Namespace) -> tuple[np.ndarray, str, float | None, Any, list[str]]:
    """Lengths of every --mix source concatenated, a description, fps, the Mix and the source names."""
    from ..core.mix import Mix, SourceSpec

    if args.inputs:
        raise ValueError("give INPUTs or --mix SOURCES, not both (a mixed plan reads its inputs from --mix)")
    sources = parse_mix(args.mix)
    parts, names, fps = [], [], args.frames_per_second
    for text, _, _ in sources:
        lens, name, got = load_inputs([text], args.field, fps, args.index_dir, args.format)
        fps = fps or got
        parts.append(lens)
        names.append(name.split(" (")[0])
    specs = [SourceSpec(**{kind: v}) for _, kind, v in sources]
    mix = Mix.build([p.size for p in parts], specs, args.samples_per_epoch)
    how = f" ({fps:g} frames/s)" if fps else ""
    return np.concatenate(parts), f"a mix of {len(parts)} sources{how}", fps, mix, names


def run_plan(args: argparse.Namespace) -> int:
    from ..core.long_samples import LongSampleWarning

    # samples over the budget are reported ("over budget N batches"), not warned about plan by plan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LongSampleWarning)
        return _run_plan(args)


def _run_plan(args: argparse.Namespace) -> int:
    from ..core.config import PlanConfig
    from ..core.long_samples import check_max_length, too_long
    from ..epoch.in_memory import InMemory
    from ..planners import get_planner, make_plan
    from ..planners.base import MAX_STEPS_OPTION
    from .figures import check_figure_path, plot_plan
    from .metrics import epoch_time_bound, format_time_report, mix_shares, plan_batches, quality, time_report
    from .outliers import find_outliers
    from .report import format_mix, format_quality, histogram, seconds_label

    plot = check_figure_path(args.plot) if args.plot else None
    options = dict(args.planner_option)
    config = PlanConfig.build(args.max_batch_tokens, args.max_batch_size, args.world_size, not args.no_shuffle,
                              args.drop_last, args.seed, args.planner, options)
    packed = config.limits.pack  # sum(L) <= budget batches: metrics without padding
    mix = None
    if args.mix:
        lengths, source, fps, mix, names = load_mix(args)
    elif not args.inputs:
        raise ValueError("give one or more INPUTs, or --mix SOURCE:WEIGHT ... to plan a weighted mix")
    elif args.samples_per_epoch is not None:
        raise ValueError("--samples-per-epoch applies to --mix")
    else:
        lengths, source, fps = load_inputs(args.inputs, args.field, args.frames_per_second, args.index_dir,
                                           args.format)
    curve = None
    if args.limit is not None:
        if "limit" in options:
            raise ValueError("give the limit curve once: --limit FILE or -o limit=FILE")
        curve = load_limit(args.limit, fps)
        options["limit"] = curve
        config = config.replace(planner_options=options)
    limit = resolve_max_length(args.max_length, fps)
    over = too_long(lengths, *check_max_length(limit, args.long_samples), budget=args.max_batch_tokens)
    # A mix plans the epoch's draw (its indices address all sources' lengths): long samples are left out of
    # it by index. One input: they are removed, as before.
    keep = np.delete(np.arange(lengths.size), over) if over.size and mix is not None else None
    if over.size and mix is None:
        lengths = np.delete(lengths, over)
    # Load the compiled planner first, so the time below is planning only.
    make_plan(np.ones(args.world_size, dtype=np.int64), config)

    t = time.perf_counter()
    if mix is None:
        plan = make_plan(lengths, config, epoch=args.epoch)
        held = lengths  # what the epoch holds
    else:
        plan, _ = InMemory(lengths, mix, keep).plan(config, args.epoch)  # the sampler's epoch of a mix
        drawn = mix.draw(args.seed, args.epoch, not args.no_shuffle)
        held = lengths[drawn if keep is None else drawn[np.isin(drawn, keep)]]
    seconds = time.perf_counter() - t
    total = int(held.size + over.size) if mix is None else mix.samples_per_epoch
    batches = plan_batches(plan, lengths, packed)
    q = quality(batches, args.max_batch_tokens)
    bound = epoch_time_bound(held, args.world_size)
    shares = None if mix is None else mix_shares(plan, mix)

    def epoch_time(kept: np.ndarray) -> float:
        again = make_plan(kept, args.max_batch_tokens, args.max_batch_size, args.world_size,
                          shuffle=not args.no_shuffle, drop_last=args.drop_last, seed=args.seed, epoch=args.epoch,
                          planner=args.planner, **options)
        return quality(plan_batches(again, kept, packed), args.max_batch_tokens).epoch_time

    note = find_outliers(held, batches, epoch_time, fps) if held.size else None
    step_model = _step_model(options)
    timing = time_report(batches, held, step_model, args.max_batch_tokens) if step_model is not None else None
    fewest = plan.fewest_steps
    # the most steps the plan may take: max_steps, else the planner's bound (None: greedy, seed-exact, has none)
    rule = config.limits
    steps_limit = None if fewest is None else rule.max_steps if rule.max_steps is not None else rule.limit_of(fewest)
    # A measured step model may keep steps above the limit when it predicts them faster: by how much.
    above = None
    if step_model is not None and mix is None and steps_limit is not None and plan.num_steps > steps_limit \
            and MAX_STEPS_OPTION in get_planner(config.planner).option_names():
        within = make_plan(held, config.replace(planner_options={**options, MAX_STEPS_OPTION: steps_limit}),
                           epoch=args.epoch)
        other = time_report(plan_batches(within, held, packed), held, step_model, args.max_batch_tokens)
        above = {"steps_within_bound": within.num_steps, "epoch_seconds_within_bound": other["epoch_seconds"],
                 "seconds_saved": other["epoch_seconds"] - timing["epoch_seconds"]}
    checked = None if curve is None else curve.check(plan, lengths, packed=packed)
    if args.json:
        out = {"samples": int(held.size), "source": source, "planner": args.planner,
               "max_batch_tokens": args.max_batch_tokens, "max_batch_size": args.max_batch_size,
               "world_size": args.world_size, "seed": args.seed, "epoch": args.epoch,
               "num_padded": plan.num_padded, "num_dropped": plan.num_dropped, "plan_seconds": seconds,
               "max_length": limit, "num_too_long": int(over.size), **q.as_dict(), "epoch_time_bound": bound,
               "outliers": None if note is None else {**note.__dict__, "text": note.text()},
               "time": timing, "cost": None if step_model is None else step_model.to_dict(),
               "fewest_steps": fewest, "fewest_exact": plan.fewest_exact,
               "steps_ratio": plan.steps_ratio, "steps_limit": steps_limit,
               "above_limit": above,
               "limit_curve": None if checked is None else {"source": curve.source, "digest": curve.digest(),
                                                             "batches_over": int(checked.over.size)}}
        if mix is not None:
            out["samples_per_epoch"] = mix.samples_per_epoch
            out["sources"] = [{"name": n, "samples": size, "quota": quota, "target_share": target,
                               "share": share, "first_10pct_share": early, "cycle": cyc, "position": pos}
                              for n, size, quota, target, share, early, (cyc, pos)
                              in zip(names, mix.sizes, mix.counts, mix.proportions().tolist(), shares[0].tolist(),
                                     shares[1].tolist(), mix.positions(args.epoch))]
        print(json.dumps(out))
    else:
        opts = "".join(f", {k}={v!r}" for k, v in options.items())
        print(f"{total:,} samples from {source}")
        if over.size:
            whose = " of the sources' samples are" if mix is not None else ""
            than = [f"--max-length {args.max_length} ({limit:,})"] if limit is not None else []
            if args.long_samples == "drop":
                than.append(f"--max-batch-tokens ({args.max_batch_tokens:,}, --long-samples drop)")
            print(f"  {over.size:,}{whose} longer than {' or '.join(than)} left out: {held.size:,} planned")
        print(f"  planner {args.planner}{opts}, max_batch_tokens {args.max_batch_tokens:,}, max_batch_size "
              f"{args.max_batch_size}, world size {args.world_size}, seed {args.seed}, epoch {args.epoch}")
        print(f"  planned in {seconds:.3f} s ({held.size / max(seconds, 1e-9) / 1e6:.1f}M samples/s, warm)")
        print(f"  {_length_summary(held, fps)}")
        extra = (f", {plan.num_padded} padded repeat(s) fill the final step" if plan.num_padded else "") + \
                (f", {plan.num_dropped} dropped with the partial final step" if plan.num_dropped else "")
        if mix is None:
            print(f"  each sample once{extra}\n")
        else:
            print(f"  drawn by weight from {len(names)} sources, each read in cycles (every sample once per "
                  f"cycle){extra}\n")
            print("\n".join(format_mix(names, mix, shares, args.epoch)) + "\n")
        print("\n".join(format_quality(q)))
        if fewest is not None:
            what = "no plan of these samples and settings has fewer" if plan.fewest_exact else \
                "a lower bound (bin packing): no plan has fewer"
            if steps_limit is None:
                held_to = f"{args.planner} is seed-exact: no step limit"
            elif rule.max_steps is not None:
                held_to = f"the limit, max_steps: {steps_limit:,}"
            else:
                held_to = f"the limit, {1 + 1 / rule.step_slack:.2f} x fewest + 1: {steps_limit:,}"
            print(f"  fewest steps         {fewest:,}   {what} (this one: {plan.steps_ratio:.3f}x; {held_to})")
        if checked is not None:
            print(f"  limit curve          {curve.source}: {checked.describe()}")
        if above is not None:
            print(f"  above the limit      the fitted model predicts these {plan.num_steps:,} steps "
                  f"{above['seconds_saved']:.4g} s faster than {above['steps_within_bound']:,} within it "
                  f"({above['seconds_saved'] / above['epoch_seconds_within_bound']:.1%})")
        print(f"  epoch time bound     {bound:.4g}   max(sum L^2 / W, max L^2): no plan is faster "
              f"(this one: {q.epoch_time / bound if bound else 1:.2f}x)")
        if timing is not None:
            print(f"\nmeasured step cost {step_model}")
            print("\n".join(format_time_report(timing)))
        if note is not None:
            print(f"\nlong samples: {note.text()}")
        print(f"\nbatch size (samples per batch, {q.batches:,} batches)")
        print("\n".join(histogram(batches.sizes[batches.sizes > 0])))
        unit = "frames" if fps else "length units"
        print(f"\nsample length ({unit}{', seconds' if fps else ''})")
        print("\n".join(histogram(held, label=seconds_label(fps))))
    if plot:
        plot_plan(plot, batches, args.max_batch_tokens, args.max_batch_size,
                  title=f"{source}: {args.planner}, budget {args.max_batch_tokens:,}, W={args.world_size}")
        print(f"\nwrote {plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def load_limit(path: str, fps: float | None) -> Any:
    """The ``--limit`` file as a ``LimitCurve``: a limit curve, a ``calibrate
    --memory`` file, or a NeMo/lhotse bucket profile (in seconds when the
    lengths are: with ``--frames-per-second``)."""
    from ..core.limits import LimitCurve, resolve_limit

    try:
        return LimitCurve.load(path)
    except ValueError:
        if fps is None:
            return resolve_limit(path)
        return LimitCurve.from_profile(path, fps)


def _step_model(options: dict):
    """The measured step model among the planner options (``-o cost=cost.json``), or None."""
    from ..core.cost import resolve_cost

    if "cost" not in options:
        return None
    cost = resolve_cost(options["cost"])
    return cost if cost.kind == "step" else None


def resolve_max_length(text: str | None, fps: float | None) -> int | None:
    """--max-length in length units: ``1500`` as is, ``30s`` at the frame rate."""
    if text is None:
        return None
    if text.endswith("s"):
        if not fps:
            raise ValueError(f"--max-length {text} is in seconds: give --frames-per-second too, or the limit in "
                             "length units (e.g. --max-length 1500)")
        return seconds_to_frames(float(text[:-1]), fps)
    return int(text)


def _length_summary(lengths: np.ndarray, fps: float | None) -> str:
    p = np.percentile(lengths, [0, 50, 95, 100], method="nearest").astype(np.int64)
    text = f"lengths: min {p[0]:,}, median {p[1]:,}, p95 {p[2]:,}, max {p[3]:,}, total {int(lengths.sum()):,}"
    if fps:
        text += f" = {audio_time(lengths.sum() / fps)}"
    return text


def add_parser(sub: Any, planners: list[str], seed_exact: str) -> None:
    pl = sub.add_parser("plan", formatter_class=Formatter, help="plan an epoch of your lengths and report its quality",
                        description=(
        "Plan one epoch of your lengths and report its quality: steps, padding and balance\n"
        "efficiency, budget use, and histograms of batch sizes and lengths.\n\n"
        "INPUT is any of (several are concatenated in order; gzip'd files work too):\n"
        "  lengths.npy          a 1-D array of lengths\n"
        "  lengths.txt          one length per line\n"
        "  cuts.jsonl.gz        JSON lines with a duration field (lhotse cuts: duration;\n"
        "                       VoxCPM-style: duration or audio_duration; others: --field)\n"
        "  'train-{000000..000099}.tar', *.tar, or a directory\n"
        "                       indexed WebDataset shards (see `streambatch index`); a directory\n"
        "                       means every .tar shard under it, subdirectories included\n"
        "  shar/, *.parquet, tarred_audio_manifest.json --format nemo\n"
        "                       a Lhotse Shar directory, Parquet files (lengths from a column:\n"
        "                       --field duration) or a NeMo tarred corpus: lengths from their own\n"
        "                       metadata, no index needed\n\n"
        "Lengths are in the units of --max-batch-tokens (frames, tokens); durations in seconds\n"
        "need --frames-per-second.\n\n"
        "--mix plans a weighted mix of several INPUTs instead (as DynamicBatchSampler.mixed and\n"
        "StreamingBatches([Source(...), ...]) do) and reports each source's realised share.\n\n"
        "examples:\n"
        "  streambatch plan cuts.jsonl.gz --frames-per-second 50 --max-batch-tokens 16000 \\\n"
        "      --world-size 8 --plot plan.png\n"
        "  streambatch plan --mix en.jsonl:0.6 zh.jsonl:0.3 inhouse.npy:0.1 --fps 50 -t 16000 -w 64"))
    pl.add_argument("inputs", nargs="*", metavar="INPUT", help="lengths file(s), manifest(s), indexed shards or a "
                    "directory of them")
    pl.add_argument("--mix", nargs="+", metavar="INPUT:WEIGHT", help="plan a weighted mix instead: each source an "
                    "INPUT with a weight (a.jsonl:0.6 b.npy:0.4) or a repeat factor (clean.npy:x3 big.npy:x1); "
                    "reports each source's realised share")
    pl.add_argument("--samples-per-epoch", type=whole(1), metavar="N",
                    help="with weighted --mix: samples drawn per epoch (default: all sources' samples)")
    add_plan_args(pl, planners, tokens=None, world=1, planner=seed_exact, seed=42,
                  tokens_help="token budget per batch: batch size x longest length <= this",
                  world_help="ranks (one batch each per step)")
    pl.add_argument("--epoch", type=whole(0), default=0, metavar="E", help="epoch to plan")
    pl.add_argument("--drop-last", action="store_true", help="drop a partial final step instead of padding it")
    pl.add_argument("--no-shuffle", action="store_true", help="plan without shuffling")
    pl.add_argument("--field", metavar="NAME", help="JSON field with each sample's length or duration, dots for "
                    "nesting, e.g. supervisions.0.duration (default: duration, else audio_duration)")
    pl.add_argument("--frames-per-second", "--fps", type=positive_float, metavar="FPS",
                    help="values are seconds: length = ceil(seconds x this) (e.g. 50 or 100)")
    pl.add_argument("--index-dir", metavar="DIR", help="where the shards' sidecars are, if not next to the shards")
    pl.add_argument("--format", choices=("webdataset", "shar", "nemo", "parquet"), default=None,
                    help="read INPUTs as corpora of this format (default: Shar directories and Parquet files are "
                         "detected; a .json is a lengths manifest unless --format nemo)")
    pl.add_argument("--max-length", type=length_limit, metavar="L",
                    help="leave out samples longer than this: length units (1500) or seconds (30s, needs the "
                         "frame rate)")
    pl.add_argument("--long-samples", choices=("warn", "drop", "raise"), default="warn",
                    help="samples longer than --max-length are left out (counted); samples longer than the budget "
                         "alone are planned alone and reported ('warn', default), left out too ('drop') or an "
                         "error ('raise')")
    pl.add_argument("--limit", metavar="FILE", help="a hard limit per padded length beside the budget: a limit "
                    "curve (LimitCurve.save), a `streambatch calibrate --memory` file, or a NeMo/lhotse bucket "
                    "profile (seconds with --frames-per-second); planners bucketed and shard_affine")
    pl.add_argument("--plot", metavar="FILE.png", help="also write a figure (needs matplotlib)")
    pl.add_argument("--json", action="store_true", help="print the metrics as one JSON object instead")
    pl.set_defaults(run=("plan", "run_plan"))
