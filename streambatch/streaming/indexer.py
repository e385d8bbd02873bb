"""The indexer: scan shards (in parallel) and write their sidecars.

Lengths come from a ``LengthSpec`` (``lengths.py``); the sidecar format and
staleness rules are ``sidecar.py``'s; the tar scan and member grouping are
``tar.py``'s.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .audio import HEADER_BYTES, audio_ext
from .errors import ShardError
from .lengths import LengthSpec, length_of, length_spec
from ..core.validation import check_int
from .reader import expand_urls, is_local, local_path, open_shard
from .sidecar import read_arrays, read_meta, shard_stat, sidecar_path, staleness, write_sidecar
from .tar import TarScanner, sample_groups


def index_shard(url: str, spec: LengthSpec) -> dict[str, np.ndarray]:
    """Scan one shard and return its sidecar arrays (see ``sidecar.py``).

    Local shards are scanned by seeking from header to header, reading only
    the members (or member heads) that ``spec`` needs; streams are read whole.
    """
    seekable = is_local(url)
    keys: list[bytes] = []
    lengths: list[int] = []
    offsets: list[int] = []
    sizes: list[int] = []
    end = 0

    def want(suffix: str) -> int | None:
        if spec.needs_all_members():
            return -1
        if not spec.wants(suffix):
            return None
        # WAV/FLAC frame counts sit in the first bytes: on a file, skip the audio.
        return HEADER_BYTES if seekable and audio_ext(suffix) in ("wav", "flac") else -1

    f = open_shard(url, seekable)
    try:
        for sample in sample_groups(TarScanner(f, url), want):

            def reread(name: str, sample=sample) -> bytes:  # a header longer than HEADER_BYTES
                here = f.tell()
                f.seek(sample.data_at[name])
                data = f.read(sample.sizes[name])
                f.seek(here)
                return data

            where = f"shard {url}, sample {sample.key!r} at byte {sample.offset}"
            lengths.append(length_of(spec, sample.members, sample.sizes, reread, where))
            keys.append(sample.key.encode("utf-8"))
            offsets.append(sample.offset)
            sizes.append(sample.end - sample.offset)
            end = sample.end
    except OSError as exc:
        raise ShardError(f"cannot read shard {url} (indexed {len(keys)} samples before the error): {exc}") from None
    finally:
        f.close()
    if seekable:
        file_size = os.path.getsize(local_path(url))
        if end > file_size:
            raise ShardError(f"shard {url} is truncated: its last sample ends at byte {end}, the file has {file_size}")
    return {
        "keys": np.array(keys, dtype=bytes) if keys else np.zeros(0, dtype="S1"),
        "lengths": np.asarray(lengths, dtype=np.int64),
        "offsets": np.asarray(offsets, dtype=np.int64),
        "sizes": np.asarray(sizes, dtype=np.int64),
    }


@dataclass(frozen=True)
class IndexSummary:
    """What ``index_shards`` found: counts and the length distribution."""

    shards: int
    indexed: int
    current: int
    samples: int
    total_length: int
    percentiles: dict[str, int]
    seconds: float

    def __str__(self) -> str:
        p = ", ".join(f"{k} {v}" for k, v in self.percentiles.items())
        return (f"{self.shards} shards ({self.indexed} indexed, {self.current} already current), "
                f"{self.samples} samples, total length {self.total_length}; length percentiles: {p}; "
                f"{self.seconds:.1f} s")


_WORKER_SPEC: LengthSpec | None = None


def _init_worker(spec: LengthSpec) -> None:
    global _WORKER_SPEC
    _WORKER_SPEC = spec


def _index_one(url: str, path: str, spec: LengthSpec | None = None) -> np.ndarray:
    spec = spec or _WORKER_SPEC
    stat = shard_stat(url)
    arrays = index_shard(url, spec)
    write_sidecar(path, url, arrays, spec, stat)
    return arrays["lengths"]


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _PlainProgress(total)
    return tqdm(total=total, desc="indexing shards", unit="shard")


class _PlainProgress:
    """Fallback when tqdm is not installed: a line every ~5% on stderr."""

    def __init__(self, total: int):
        self.total, self.n, self.step = total, 0, max(1, total // 20)

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.n % self.step == 0 or self.n == self.total:
            print(f"indexed {self.n}/{self.total} shards", file=sys.stderr)

    def close(self) -> None:
        pass


def index_shards(urls: Any, *, length_from: Any = "json:duration", frames_per_second: Any = None,
                 index_dir: str | None = None, workers: int | None = None, progress: bool = True,
                 force: bool = False) -> IndexSummary:
    """Write a sidecar for every shard that lacks a current one.

    urls: a brace pattern, a path or a list of shard URLs.
    length_from / frames_per_second: see ``LengthSpec``.
    workers: processes scanning shards in parallel (default: CPU count;
    1 scans in this process, which also allows lambdas as ``length_from``).
    force: re-index shards even when their sidecar is current.
    A sidecar written with another ``length_from`` counts as stale.
    """
    t0 = time.perf_counter()
    urls = expand_urls(urls)
    spec = length_spec(length_from, frames_per_second)
    workers = check_int("workers", (os.cpu_count() or 1) if workers is None else workers, 1)
    paths = [sidecar_path(u, index_dir) for u in urls]
    todo, lengths = [], {}
    for i, (url, path) in enumerate(zip(urls, paths)):
        if not force and os.path.exists(path):
            try:
                meta = read_meta(path)
            except Exception:
                meta = None
            if meta is not None and meta.get("length_from") == spec.describe() and staleness(url, meta) is None:
                lengths[i] = read_arrays(path, ("lengths",))[0]
                continue
        todo.append(i)
    bar = _progress(len(todo), progress and bool(todo))
    try:
        if workers == 1 or len(todo) <= 1:
            for i in todo:
                lengths[i] = _index_one(urls[i], paths[i], spec)
                if bar:
                    bar.update(1)
        else:
            import multiprocessing as mp

            # fork passes the spec to workers by inheritance, so lambdas work too.
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
            with ProcessPoolExecutor(min(workers, len(todo)), mp_context=ctx, initializer=_init_worker,
                                     initargs=(spec,)) as pool:
                futures = {pool.submit(_index_one, urls[i], paths[i]): i for i in todo}
                from concurrent.futures import as_completed

                for fut in as_completed(futures):
                    lengths[futures[fut]] = fut.result()
                    if bar:
                        bar.update(1)
    finally:
        if bar:
            bar.close()
    every = np.concatenate([lengths[i] for i in range(len(urls))]) if urls else np.zeros(0, np.int64)
    qs = {"min": 0, "p5": 5, "p50": 50, "p95": 95, "max": 100}
    pct = {k: int(np.percentile(every, q, method="nearest")) for k, q in qs.items()} if every.size else {}
    return IndexSummary(len(urls), len(todo), len(urls) - len(todo), int(every.size), int(every.sum()), pct,
                        time.perf_counter() - t0)

