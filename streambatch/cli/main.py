"""The ``streambatch`` command line: ``demo``, ``plan``, ``bench`` and ``index``.

Thin glue: argument parsing, one-line errors and printing. The work is done
by ``make_plan``, ``streambatch.report``, ``streambatch.manifest``, the
streaming package, and one module per subcommand in this package.

User mistakes (bad arguments, unreadable or malformed inputs) print one line,
``streambatch: error: ...``, on stderr and exit with status 2; set
``STREAMBATCH_TRACEBACK=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn


PROG = "streambatch"


# ---------------------------------------------------------------- argument types


def _number(text: str) -> float:
    try:
        return float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _whole(minimum: int | None) -> Callable[[str], int]:
    """Integers, also written 16_000 or 1e6 (sizes are easier to type so)."""
    def parse(text: str) -> int:
        v = _number(text)
        if not math.isfinite(v) or v != int(v) or (minimum is not None and v < minimum):
            floor = "" if minimum is None else f" >= {minimum}"
            raise argparse.ArgumentTypeError(f"expected a whole number{floor}, got {text!r}")
        return int(v)

    parse.__name__ = "integer"  # what argparse names in "invalid integer value"
    return parse


def _positive_float(text: str) -> float:
    v = _number(text)
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v


def _option(text: str) -> tuple[str, Any]:
    """KEY=VALUE planner option; VALUE is read as JSON when it parses (0.05, true, "x"), else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. bucket_width=0.05), got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line naming the help to read."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see `{self.prog} --help`)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; defaults shown where there is one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if not action.option_strings or d is None or d is False or d == [] or d is argparse.SUPPRESS \
                or "(default" in text:
            return text
        shown = " ".join(map(str, d)) if isinstance(d, list) else str(d)
        return f"{text} (default: {shown.replace('%', '%%')})"


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    from ..planners import PLANNERS

    planners = sorted(PLANNERS)
    p = _Parser(prog=PROG, formatter_class=_Formatter, description=(
        "Token-budget batch planning for speech and audio training.\n\n"
        "  streambatch demo                                   see the whole job on a generated corpus\n"
        "  streambatch plan LENGTHS --max-batch-tokens T      quality of a plan for your lengths\n"
        "  streambatch bench                                  planning speed at scale\n"
        "  streambatch index 'shards-{000000..000099}.tar'    write sidecar indexes for streaming"))
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    d = sub.add_parser("demo", formatter_class=_Formatter, help="write, index and stream a small demo corpus",
                       description=(
        "Write a small corpus of audio shards (generated pseudo-speech, or espeak-ng speech with\n"
        "--speech espeak), index it, and stream it with StreamingBatches for --world-size simulated\n"
        "ranks in this process, each through a DataLoader with --workers workers. Prints steps per\n"
        "rank, padding and balance efficiency and samples/s. Takes well under a minute."))
    d.add_argument("--dir", metavar="DIR", help="write the corpus here and keep it (default: a temporary directory, removed after)")
    d.add_argument("--shards", type=_whole(1), default=8, metavar="N", help="shards to write")
    d.add_argument("--samples-per-shard", type=_whole(1), default=50, metavar="N", help="utterances per shard")
    d.add_argument("--max-batch-tokens", type=_whole(1), default=2000, metavar="T",
                   help="token budget per batch, in frames (50 frames/s: 2000 = 40 s of audio)")
    d.add_argument("--max-batch-size", type=_whole(1), default=64, metavar="B", help="at most this many samples per batch")
    d.add_argument("--world-size", type=_whole(1), default=2, metavar="W", help="simulated ranks")
    d.add_argument("--workers", type=_whole(0), default=2, metavar="N", help="DataLoader workers per rank")
    d.add_argument("--planner", choices=planners, default=recommended_planner(planners), help="batch planner")
    d.add_argument("--speech", choices=("generated", "espeak", "auto"), default="generated",
                   help="audio: generated pseudo-speech (fast), espeak-ng speech, or espeak-ng when installed")
    d.add_argument("--seed", type=_whole(None), default=0, metavar="S", help="corpus and planning seed")
    d.set_defaults(run=("demo", "run_demo"))

    pl = sub.add_parser("plan", formatter_class=_Formatter, help="plan an epoch of your lengths and report its quality",
                        description=(
        "Plan one epoch of your lengths and report its quality: steps, padding and balance\n"
        "efficiency, budget use, and histograms of batch sizes and lengths.\n\n"
        "INPUT is any of (several are concatenated in order; gzip'd files work too):\n"
        "  lengths.npy          a 1-D array of lengths\n"
        "  lengths.txt          one length per line\n"
        "  cuts.jsonl.gz        JSON lines with a duration field (lhotse cuts: duration;\n"
        "                       VoxCPM-style: duration or audio_duration; others: --field)\n"
        "  'train-{000000..000099}.tar', a shard directory, or *.tar\n"
        "                       indexed WebDataset shards (see `streambatch index`)\n\n"
        "Lengths are in the units of --max-batch-tokens (frames, tokens); durations in seconds\n"
        "need --frames-per-second.\n\n"
        "example:\n"
        "  streambatch plan cuts.jsonl.gz --frames-per-second 50 --max-batch-tokens 16000 \\\n"
        "      --world-size 8 --plot plan.png"))
    pl.add_argument("inputs", nargs="+", metavar="INPUT", help="lengths file(s), manifest(s) or indexed shards")
    pl.add_argument("-t", "--max-batch-tokens", type=_whole(1), required=True, metavar="T",
                    help="token budget per batch: batch size x longest length <= this")
    pl.add_argument("-b", "--max-batch-size", type=_whole(1), default=64, metavar="B", help="at most this many samples per batch")
    pl.add_argument("-w", "--world-size", type=_whole(1), default=1, metavar="W", help="ranks (one batch each per step)")
    pl.add_argument("--planner", choices=planners, default="greedy", help="batch planner")
    pl.add_argument("-o", "--planner-option", type=_option, action="append", default=[], metavar="KEY=VALUE",
                    help="planner keyword option, repeatable (e.g. bucket_width=0.05 for the bucketed planner)")
    pl.add_argument("--seed", type=_whole(None), default=42, metavar="S", help="planning seed")
    pl.add_argument("--epoch", type=_whole(0), default=0, metavar="E", help="epoch to plan")
    pl.add_argument("--drop-last", action="store_true", help="drop a partial final step instead of padding it")
    pl.add_argument("--no-shuffle", action="store_true", help="plan without shuffling")
    pl.add_argument("--field", metavar="NAME", help="JSON field with each sample's length or duration, dots for "
                    "nesting, e.g. supervisions.0.duration (default: duration, else audio_duration)")
    pl.add_argument("--frames-per-second", "--fps", type=_positive_float, metavar="FPS",
                    help="values are seconds: length = ceil(seconds x this) (e.g. 50 or 100)")
    pl.add_argument("--index-dir", metavar="DIR", help="where the shards' sidecars are, if not next to the shards")
    pl.add_argument("--plot", metavar="FILE.png", help="also write a figure (needs matplotlib)")
    pl.add_argument("--json", action="store_true", help="print the metrics as one JSON object instead")
    pl.set_defaults(run=("plan", "run_plan"))

    b = sub.add_parser("bench", formatter_class=_Formatter, help="planning speed at scale",
                       description=(
        "Planning speed on audio-like lengths (log-normal 0.5-30 s at 50 frames/s, budget 16,000\n"
        "frames, cap 64): every planner over a grid of N and W, warm, one process: time, samples/s,\n"
        "peak planning memory. Then the pure-Python seed algorithm, O(N x W^2), at a size it\n"
        "finishes. Tables are markdown; progress goes to stderr.\n\n"
        "example (Emilia scale, several minutes):\n"
        "  streambatch bench --sizes 1e6 1e7 4e7 --worlds 8 64 512 --plot bench.png"))
    b.add_argument("-n", "--sizes", type=_whole(1), nargs="+", default=[100_000, 1_000_000], metavar="N",
                   help="numbers of samples (1e6 and 4e7 work)")
    b.add_argument("-w", "--worlds", type=_whole(1), nargs="+", default=[8, 64], metavar="W", help="world sizes")
    b.add_argument("--planners", nargs="+", choices=planners, default=planners, metavar="P",
                   help=f"planners to time (default: all: {' '.join(planners)})")
    b.add_argument("--repeats", type=_whole(1), metavar="R", help="timed runs per cell, best kept (default: 3, 1 from N >= 1e7)")
    b.add_argument("--seed-n", type=_whole(0), default=20_000, metavar="N",
                   help="samples for the pure-Python seed comparison (0 skips it)")
    b.add_argument("--seed-worlds", type=_whole(1), nargs="+", default=[8], metavar="W",
                   help="world sizes for the seed comparison (its time grows as W^2: W=64 at 20,000 takes ~1 min)")
    b.add_argument("--compile-times", action="store_true",
                   help="also time Numba compilation in fresh processes (cold and warm cache; ~1 min)")
    b.add_argument("--plot", metavar="FILE.png", help="also draw throughput against N and W (needs matplotlib)")
    b.set_defaults(run=("bench", "run_bench"))

    ix = sub.add_parser("index", formatter_class=_Formatter, help="write sidecar indexes of WebDataset shards",
                        description=(
        "Write a sidecar index (<shard>.idx.npz: keys, lengths, byte offsets) for every shard that\n"
        "lacks a current one, in parallel, without decoding audio. StreamingBatches and\n"
        "`streambatch plan` read them.\n\n"
        "examples:\n"
        "  streambatch index 'data/train-{000000..000999}.tar' --frames-per-second 50\n"
        "  streambatch index data/*.tar --length-from audio --frames-per-second 100\n"
        "  streambatch index 's3://bucket/train-{000000..000999}.tar' --fps 50 -s endpoint_url=http://minio:9000\n"
        "  streambatch index 'hf://datasets/org/name/train-{0000..0099}.tar' --fps 50 --index-dir idx/\n"
        "  streambatch index SHARDS --part 3/16 ... ; then: streambatch index SHARDS --merge 16"))
    ix.add_argument("shards", nargs="+", metavar="SHARD", help="shard paths, brace patterns, URLs or directories of .tar shards")
    ix.add_argument("--length-from", default="json:duration", metavar="SOURCE",
                    help="json:FIELD (a field of the .json member), audio (header of the first audio member) "
                         "or audio:SUFFIX")
    ix.add_argument("--frames-per-second", "--fps", type=_positive_float, metavar="FPS",
                    help="the value is seconds: length = ceil(seconds x this)")
    ix.add_argument("--index-dir", metavar="DIR", help="write sidecars here, a local directory or a URL (default: "
                    "next to each shard, through fsspec for s3://, gs://, hf://; required for pipe: and plain http)")
    ix.add_argument("--workers", type=_whole(1), metavar="N",
                    help="shards scanned at once (default: CPU count of processes; remote shards: 16 threads)")
    ix.add_argument("--force", action="store_true", help="re-index shards whose sidecar is current")
    ix.add_argument("--storage-option", "-s", action="append", default=[], metavar="KEY=VALUE",
                    help="fsspec option for remote shards, repeatable (e.g. endpoint_url=http://host:9000, "
                         "anon=true); credentials come from the environment as usual, never from logs")
    ix.add_argument("--catalog", metavar="PATH", help="the catalog file to write (default: <index-dir or the "
                    "first shard's directory>/streambatch.catalog.npz)")
    ix.add_argument("--no-catalog", action="store_true", help="write sidecars only")
    ix.add_argument("--part", metavar="I/N", help="index only part I of N (shard k with k %% N == I) and write "
                    "catalog part I; under torchrun RANK/WORLD_SIZE split the work without this")
    ix.add_argument("--merge", type=_whole(1), metavar="N", help="merge the N catalog parts into the catalog "
                    "(after every --part run finished)")
    ix.add_argument("--no-progress", action="store_true", help="no progress bar")
    ix.set_defaults(run=("index", "run_index"))
    return p


def recommended_planner(planners: list[str]) -> str:
    """The planner the README recommends for new runs when installed, else the seed-exact default."""
    return "bucketed" if "bucketed" in planners else "greedy"


def _version() -> str:
    from .. import __version__

    return __version__


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 user error)."""
    args = build_parser().parse_args(argv)
    try:
        module, name = args.run  # imported only when run: `--help` stays light
        return getattr(importlib.import_module(f".{module}", __package__), name)(args) or 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `streambatch plan ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, OSError, ImportError, LookupError, MemoryError) as exc:
        if os.environ.get("STREAMBATCH_TRACEBACK"):
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


# The library's messages name Python arguments; on the command line, say the flags.
_FLAG_WORDS = (
    ("pass frames_per_second", "pass --frames-per-second"),
    (" (or streambatch.index_shards(...))", ""),
    (", or pass index_missing=True to index local shards on the fly", ""),
)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        msg = f"{exc.filename}: {exc.strerror}"
    else:
        msg = str(exc) or type(exc).__name__
    for api, flag in _FLAG_WORDS:
        msg = msg.replace(api, flag)
    return " ".join(msg.split())


if __name__ == "__main__":
    sys.exit(main())
