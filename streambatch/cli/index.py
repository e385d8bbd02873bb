"""``streambatch index``: write the sidecar indexes and the catalog ``StreamingBatches`` reads."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..core.redact import scrub
from .args import Formatter, positive_float, whole
from .formats import corpus_of, describe_corpus
from .plan import shard_list
from .report import audio_time


def storage_options(pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs as fsspec options: VALUE parsed as JSON when it is
    (true, 3, {"a": 1}), else kept as a string; dotted keys nest
    (``client_kwargs.endpoint_url=...``)."""
    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--storage-option takes KEY=VALUE (e.g. anon=true), got {pair!r}")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = parsed
    return out


def launcher_part() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) as a launcher (torchrun) set them, else None. Inherited values look the same: a
    subprocess of rank 0 has them too, so they split the work only under ``--distributed``."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, world) if 0 <= rank < world else None


_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def started_by_torchrun() -> bool:
    """Is this process a worker torchrun's agent started itself (its parent runs torchrun, and the elastic
    agent's TORCHELASTIC_RUN_ID is set)? A process that a worker started in turn (a subprocess of rank 0) has
    the same environment but another parent: it is not one of the job's ranks. Linux (/proc) only; elsewhere
    False (pass --distributed)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            words = f.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(os.path.basename(w) in _LAUNCHERS or w in _LAUNCHERS for w in words[:4])


def join_ranks(part: tuple[int, int], timeout: float) -> None:
    """``--distributed``: meet the other ranks (torch.distributed, gloo, env:// rendezvous) before any work,
    waiting at most ``timeout`` seconds, so that a rank that never comes is an error, not a silent wait."""
    from datetime import timedelta

    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    except Exception as exc:  # the store's timeout, a refused connection, a port in use
        raise TimeoutError(
            f"--distributed: rank {part[0]} of {part[1]} did not meet the other ranks within {timeout:g} s "
            f"(MASTER_ADDR={os.environ.get('MASTER_ADDR', '?')}, MASTER_PORT={os.environ.get('MASTER_PORT', '?')}: "
            f"{' '.join(str(exc).split())[:300]}); start every rank with torchrun (or raise --join-timeout), or "
            "drop --distributed to index every shard in this process") from None


def run_index(args: argparse.Namespace) -> int:
    from ..streaming.io.retry import RetryPolicy
    from ..streaming.io.urls import expand_urls
    from ..streaming.shards.indexer import index_shards, merge_catalog, parse_part
    from ..streaming.shards.sidecar import default_index_dir

    options = storage_options(args.storage_option) or None
    found = corpus_of(args.shards[0], args.format) if len(args.shards) == 1 else None
    if found is not None:  # Shar, NeMo, Parquet: lengths in their own metadata, nothing to write
        describe_corpus(args.shards[0], found, args.length_from, args.frames_per_second, options)
        return 0
    shards = [u for text in args.shards for u in shard_list(text)]
    if args.length_from is None and args.frames_per_second is None:
        recorded = recorded_length_source(shards, args.index_dir, options)
        if recorded is not None:  # re-indexing keeps the lengths the sidecars were made with
            args.length_from, args.frames_per_second = recorded
            print(f"lengths as the existing sidecars have them: --length-from {args.length_from}"
                  + (f" --frames-per-second {args.frames_per_second:g}" if args.frames_per_second else "")
                  + " (pass --length-from/--frames-per-second to change)", file=sys.stderr)
    args.length_from = args.length_from or "json:duration"
    retry = RetryPolicy(timeout=args.timeout)
    catalog = False if args.no_catalog else (args.catalog or True)
    if args.merge:
        meta = merge_catalog(shards, args.merge, index_dir=args.index_dir, catalog=args.catalog,
                             storage_options=options, retry=retry)
        print(f"merged {args.merge} parts: catalog of {meta['shards']:,} shards, {meta['samples']:,} samples")
        return 0
    part = parse_part(args.part) if args.part else None
    launched = launcher_part()
    if not args.distributed and not args.part and launched is not None and launched[1] > 1:
        args.distributed = started_by_torchrun()  # `torchrun ... -m streambatch.cli index`: the ranks split the work
    if args.distributed:
        if args.part or launched is None:
            raise ValueError("--distributed splits the shards over the ranks of a torchrun job, from the RANK and "
                             "WORLD_SIZE it sets (`torchrun --nproc-per-node 8 -m streambatch.cli index SHARDS "
                             "--distributed`); here " + ("--part says which part" if args.part else
                                                        "RANK/WORLD_SIZE are not set") + ": drop one of them")
        part = launched
        if part[1] > 1:
            join_ranks(part, args.join_timeout)
    elif launched is not None and launched[1] > 1 and not args.part:
        print(f"note: RANK={launched[0]}, WORLD_SIZE={launched[1]} are set, but this process was not started by "
              "torchrun itself (a process a training job starts inherits them), so it indexes every shard; pass "
              "--distributed to split the work over the ranks of a job", file=sys.stderr)
    try:
        s = index_shards(shards, length_from=args.length_from, frames_per_second=args.frames_per_second,
                         index_dir=args.index_dir, workers=args.workers,
                         progress=not args.no_progress and sys.stderr.isatty(), force=args.force,
                         storage_options=options, part=part, catalog=catalog, retry=retry)
    except (ValueError, OSError) as exc:
        if args.distributed and part[1] > 1:
            _report_to_ranks(part, exc)
        hint = rerun_hint(args, str(exc))
        if hint is None:
            raise
        raise ValueError(f"{exc}; {hint}") from exc
    if args.distributed and part[1] > 1:
        _merge_under_torchrun(shards, part, args, options, retry)
    fps = args.frames_per_second
    sec = (lambda v: f" ({v / fps:.1f} s)") if fps else (lambda v: "")
    local_home = default_index_dir(expand_urls(shards)[0]) if not args.index_dir and s.shards else None
    if args.index_dir:
        where = f"in {scrub(args.index_dir)}"
    elif local_home is not None:  # HTTP(S) / Hub shards: the store takes no uploads
        where = f"in {local_home} (this machine; set STREAMBATCH_INDEX_DIR or --index-dir for shared storage)"
    else:
        where = "next to the shards"
    of = f" (part {part[0]} of {part[1]})" if part is not None and part[1] > 1 else ""
    print(f"{s.shards:,} shards{of}: {s.indexed:,} indexed, {s.current:,} already current ({s.seconds:.1f} s); "
          f"sidecars {where}")
    print(f"  samples          {s.samples:,}")
    total = f"{s.total_length:,}"
    if fps:
        total += f" frames = {audio_time(s.total_length / fps)}"
    print(f"  total length     {total}")
    if s.percentiles:
        print("  length           " + ", ".join(f"{k} {v:,}{sec(v)}" for k, v in s.percentiles.items()))
    if args.length_from.startswith("audio") and not fps:
        # lengths in audio samples are legitimate, but a budget written for frames would be 300x too small
        print("note: without --frames-per-second the lengths are counts of audio samples (sample rate x seconds: "
              "16,000 per second of 16 kHz audio), and max_batch_tokens counts them too; to plan in 20 ms frames, "
              "re-index with --frames-per-second 50 --force", file=sys.stderr)
    pattern = args.shards[0] if len(args.shards) == 1 else "SHARDS..."
    flags = f" --index-dir {args.index_dir}" if args.index_dir else ""  # the sidecars tell plan the frame rate
    if args.part:
        print(f"next, once all {part[1]} parts are done: streambatch index '{scrub(pattern)}'{flags} --merge {part[1]}")
    else:
        budget = suggested_budget(s.percentiles.get("max", 0))
        print(f"next: streambatch plan '{scrub(pattern)}'{flags} --max-batch-tokens {budget} --world-size 8")
    return 0


def suggested_budget(longest: int) -> int:
    """A ``--max-batch-tokens`` to start from, in the lengths' own units: 16,000 (320 s of 50 frames/s audio per
    batch), or room for two of the longest samples when that is more (lengths in audio samples, long clips), so
    that no batch is over budget. Rounded up to two significant digits."""
    want = max(16_000, 2 * int(longest))
    scale = 10 ** max(0, len(str(want)) - 2)
    return -(-want // scale) * scale


def recorded_length_source(shards: list[str], index_dir: str | None, options: dict | None
                           ) -> tuple[str, float | None] | None:
    """(length_from, frames_per_second) recorded in the first shard's sidecar, if it has a readable one
    made without a Python function; else None."""
    from ..streaming.io.urls import expand_urls
    from ..streaming.shards.lengths import LengthSpec
    from ..streaming.shards.sidecar import read_meta, sidecar_path

    try:
        first = expand_urls(shards)[0]
        described = read_meta(sidecar_path(first, index_dir), options)["length_from"]
    except Exception:  # no sidecar yet, or a broken one: nothing to keep
        return None
    return LengthSpec.parse_described(described)


def rerun_hint(args: argparse.Namespace, message: str) -> str | None:
    """The command to run instead, for the length-source errors that name a missing flag, and for brace ranges
    written without the zero padding of the files (``{0..7}`` for ``{000000..000007}``)."""
    from ..streaming.io.urls import expand_urls, padding_fix
    from ..streaming.shards.hints import HINT_FPS

    fixed = [padding_fix(t) for t in args.shards] if "no such file" in message.lower() else []
    if any(fixed):
        shards = [f or t for f, t in zip(fixed, args.shards)]
        example = os.path.basename(expand_urls(next(f for f in fixed if f))[0])
        why = "" if "zero padding" in message else (f"the shard files are numbered with zero padding ({example}; a "
                                                     "brace range keeps the digits it is written with): ")
        return f"{why}run `{command_line(args, {}, shards)}`"
    if "a fraction" in message and args.frames_per_second is None:
        flags = {"--frames-per-second": str(HINT_FPS)}
        why = f"durations in seconds become lengths of ceil(seconds x {HINT_FPS})"
    elif (("no .json member" in message or ("has no field" in message and "--length-from audio" in message))
          and not args.length_from.startswith("audio")):
        flags = {"--length-from": "audio", "--frames-per-second": f"{args.frames_per_second or HINT_FPS:g}"}
        why = "lengths from the audio headers"
    else:
        return None
    return f"run `{command_line(args, flags)}` ({why})"


def command_line(args: argparse.Namespace, flags: dict[str, str], shards: list[str] | None = None) -> str:
    """``streambatch index`` with this run's shards (or ``shards``) and options, ``flags`` set on top."""
    from ..streaming.shards.hints import quote

    given = {"--length-from": args.length_from if args.length_from != "json:duration" else None,
             "--frames-per-second": f"{args.frames_per_second:g}" if args.frames_per_second else None,
             "--index-dir": args.index_dir, "--catalog": args.catalog}
    given.update(flags)
    words = ["streambatch", "index", *(quote(scrub(t)) for t in (shards or args.shards))]
    words += [f"{k} {quote(v) if k in ('--index-dir', '--catalog') else v}" for k, v in given.items() if v]
    words += [f"-s {quote(scrub(kv))}" for kv in args.storage_option]
    words += [flag for flag, on in (("--force", args.force), ("--no-catalog", args.no_catalog)) if on]
    return " ".join(words)


# How long ranks that finished their part wait for the slowest (the ranks met already; this bounds a stuck one).
INDEX_WAIT_S = 24 * 3600


def _statuses(part: tuple[int, int], failure: BaseException | None) -> list[str | None]:
    """Every rank's failure (a line) or None, once all ranks are done with their part."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.monitored_barrier(timeout=timedelta(seconds=INDEX_WAIT_S), wait_all_ranks=True)
    out: list[str | None] = [None] * part[1]
    dist.all_gather_object(out, None if failure is None else f"{type(failure).__name__}: {failure}")
    return out


def _report_to_ranks(part: tuple[int, int], failure: BaseException) -> None:
    """This rank failed its part: tell the others (they would wait for it), then leave the group."""
    import torch.distributed as dist

    try:
        _statuses(part, failure)
    finally:
        dist.destroy_process_group()


def _merge_under_torchrun(shards, part, args, options, retry=None) -> None:
    """Every rank has written its part: rank 0 merges them into the catalog, unless a rank failed."""
    import torch.distributed as dist

    from ..streaming.shards.indexer import merge_catalog

    try:
        failed = [(r, f) for r, f in enumerate(_statuses(part, None)) if f is not None]
        if failed:
            raise ValueError(f"rank {failed[0][0]} failed to index its part ({scrub(failed[0][1])}); the "
                               "catalog was not merged: fix that and run the job again (current sidecars are kept)")
        if part[0] == 0 and not args.no_catalog:
            merge_catalog(shards, part[1], index_dir=args.index_dir, catalog=args.catalog, storage_options=options,
                          retry=retry)
    finally:
        dist.destroy_process_group()


def add_parser(sub: Any) -> None:
    ix = sub.add_parser("index", formatter_class=Formatter, help="write sidecar indexes of WebDataset shards",
                        description=(
        "Write a sidecar index (<shard>.idx.npz: keys, lengths, byte offsets) for every shard that\n"
        "lacks a current one, in parallel, without decoding audio. StreamingBatches and\n"
        "`streambatch plan` read them.\n\n"
        "examples:\n"
        "  streambatch index 'data/train-{000000..000999}.tar' --frames-per-second 50\n"
        "  streambatch index data/*.tar --length-from audio --frames-per-second 100\n"
        "  streambatch index 's3://bucket/train-{000000..000999}.tar' --fps 50 \\\n"
        "      -s endpoint_url=http://minio:9000\n"
        "  streambatch index 'hf://datasets/org/name/train-{0000..0099}.tar' --fps 50 --index-dir idx/\n"
        "  streambatch index SHARDS --part 3/16 ... ; then: streambatch index SHARDS --merge 16\n"
        "  torchrun --nnodes 4 --nproc-per-node 8 -m streambatch.cli index SHARDS --fps 50"))
    ix.add_argument("shards", nargs="+", metavar="SHARD",
                    help="shard paths, brace patterns, URLs or directories (every .tar shard under them)")
    ix.add_argument("--length-from", default=None, metavar="SOURCE",
                    help="json:FIELD (a field of the .json member), audio (header of the first audio member) "
                         "or audio:SUFFIX (default: as the existing sidecars say, else json:duration)")
    ix.add_argument("--frames-per-second", "--fps", type=positive_float, metavar="FPS",
                    help="the value is seconds: length = ceil(seconds x this) (default: as the existing sidecars "
                         "say, else none: the value is already a count)")
    ix.add_argument("--index-dir", metavar="DIR", help="write sidecars here, a local directory or a URL (default: "
                    "next to each shard, through fsspec for s3://, gs://, az://; for http(s):// and hf:// shards, "
                    "which take no uploads, $STREAMBATCH_INDEX_DIR or ~/.cache/streambatch/index; required for pipe:)")
    ix.add_argument("--workers", type=whole(1), metavar="N",
                    help="shards scanned at once (default: CPU count of processes; remote shards: 16 threads)")
    ix.add_argument("--force", action="store_true", help="re-index shards whose sidecar is current")
    ix.add_argument("--storage-option", "-s", action="append", default=[], metavar="KEY=VALUE",
                    help="fsspec option for remote shards, repeatable (e.g. endpoint_url=http://host:9000, "
                         "anon=true); credentials come from the environment as usual, never from logs")
    ix.add_argument("--timeout", type=positive_float, default=60.0, metavar="SECONDS",
                    help="seconds to wait for a server's answer to each remote request before retrying it "
                         "(RetryPolicy.timeout; default 60)")
    ix.add_argument("--catalog", metavar="PATH", help="the catalog file to write (default: <index-dir or the "
                    "first shard's directory>/streambatch.catalog.npz)")
    ix.add_argument("--no-catalog", action="store_true", help="write sidecars only")
    ix.add_argument("--part", metavar="I/N", help="index only part I of N (shard k with k %% N == I) and write "
                    "catalog part I (one of N machines; --merge N afterwards)")
    ix.add_argument("--distributed", action="store_true", help="split the shards over the ranks of a torchrun "
                    "job (RANK/WORLD_SIZE), which meet first through torch.distributed; rank 0 merges the catalog. "
                    "The default for a process torchrun started itself; a process that merely inherits "
                    "RANK/WORLD_SIZE (started by a training job) indexes every shard")
    ix.add_argument("--join-timeout", type=positive_float, default=300.0, metavar="SECONDS",
                    help="--distributed: seconds to wait for every rank to start before failing")
    ix.add_argument("--merge", type=whole(1), metavar="N", help="merge the N catalog parts into the catalog "
                    "(after every --part run finished)")
    ix.add_argument("--no-progress", action="store_true", help="no progress bar")
    ix.add_argument("--format", choices=("webdataset", "shar", "nemo", "parquet"), default=None,
                    help="the corpus format (default: detected); Shar, NeMo and Parquet corpora need no index: "
                         "their lengths are read and summarised")
    ix.set_defaults(run=("index", "run_index"))
