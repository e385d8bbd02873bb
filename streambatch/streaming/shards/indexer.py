"""The indexer: scan shards (in parallel) and write their sidecars.

Lengths come from a ``LengthSpec`` (``lengths.py``); the sidecar format is
``sidecar.py``'s and the staleness rules ``shard_identity.py``'s; the tar
scan is ``formats/tar.py``'s and the member grouping ``formats/tar_samples.py``'s.

Stream: shards -> their sidecars (and a catalog file), written.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ...core.redact import scrub_url, scrubbing
from ...core.types import IntLike, LengthFrom, UrlsLike
from ...core.validation import check_int
from ..errors import ShardError
from ..formats.audio import HEADER_BYTES, HEADER_EXTS, audio_ext
from ..formats.tar import TarScanner
from ..formats.tar_samples import read_member, sample_groups
from ..io.objects import is_remote
from ..io.ranged import AUDIO_HEAD, READAHEAD, StreamFile, exists, open_ranged, remote_stat
from ..io.reader import open_shard
from ..io.retry import RangeIgnored, RetryPolicy, as_policy
from ..io.urls import expand_urls, is_local, local_path, padding_fix
from .catalog_file import catalog_arrays, check_entries, default_catalog_path, merge_parts, part_path, write_catalog
from .identity import HashingStream, content_hasher, shard_stat, staleness
from .lengths import LengthSpec, length_of, length_spec
from .sidecar import SidecarFile, sidecar_path, write_sidecar

log = logging.getLogger("streambatch.streaming")


class RangeNotice:
    """One warning per indexing run for servers that ignore Range requests,
    and the hosts found doing so (their other shards stream at once)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.hosts: set[str] = set()

    def ignores(self, url: str) -> bool:
        return urlsplit(url).netloc in self.hosts

    def note(self, url: str) -> None:
        parts = urlsplit(url)
        with self._lock:
            first = not self.hosts
            self.hosts.add(parts.netloc)
        if first:
            log.warning("the server of %s ignores Range requests (it answered a ranged GET with the whole shard): "
                        "indexing streams each of its shards once, front to back, reading every byte (a server "
                        "that honours Range reads about 4 KiB per sample); serve the shards with Range support "
                        "(nginx does unless `max_ranges 0`) to index them cheaply", scrub_url(url))


def index_shard(url: str, spec: LengthSpec, storage_options: dict | None = None,
                stat: dict | None = None, hasher=None, retry: RetryPolicy | None = None,
                ranges: RangeNotice | None = None) -> dict[str, np.ndarray]:
    """Scan one shard and return its sidecar arrays (see ``sidecar.py``).

    Local shards are scanned by seeking from header to header, reading only
    the members (or member heads) that ``spec`` needs; so are remote (fsspec)
    shards, through small ranged reads (``remote_index.py``) under ``retry``;
    pipes are read whole (and fed to ``hasher``, a hashlib object, if given),
    and so are remote shards on a server that ignores Range requests
    (``ranges`` warns once per run and remembers the server).
    """
    if not is_remote(url):
        return _scan(url, spec, storage_options, None, hasher, retry, ranged=False)
    stat = stat or remote_stat(url, storage_options, retry)
    ranges = ranges or RangeNotice()
    if not ranges.ignores(url):
        try:
            return _scan(url, spec, storage_options, stat, None, retry, ranged=True)
        except RangeIgnored:
            ranges.note(url)
    return _scan(url, spec, storage_options, stat, None, retry, ranged=False)


def _scan(url: str, spec: LengthSpec, storage_options: dict | None, stat: dict | None, hasher,
          retry: RetryPolicy | None, ranged: bool) -> dict[str, np.ndarray]:
    remote = stat is not None
    seekable = is_local(url) or (remote and ranged)
    head = AUDIO_HEAD if remote else HEADER_BYTES
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
        return head if seekable and audio_ext(suffix) in HEADER_EXTS else -1

    if remote and ranged:
        # A miss fetches a whole member head (pax header, record, header, first data block) in one GET.
        readahead = 1 << 20 if spec.needs_all_members() else READAHEAD
        f = open_ranged(url, stat["size"], storage_options, readahead=readahead, retry=retry)
    elif remote:  # one streaming GET, whole members read as from a pipe
        f = StreamFile(url, stat, storage_options, retry)
    else:
        f = open_shard(url, seekable)
        if hasher is not None and not seekable:
            f = HashingStream(f, hasher)
    try:
        for sample in sample_groups(TarScanner(f, url), want):

            def reread(name: str, sample=sample) -> bytes:  # a header longer than HEADER_BYTES
                return read_member(f, sample, name)  # sparse members rebuilt too

            where = f"shard {scrub_url(url)}, sample {sample.key!r} at byte {sample.offset}"
            lengths.append(length_of(spec, sample.members, sample.sizes, reread, where))
            keys.append(sample.key.encode("utf-8", "surrogateescape"))  # non-UTF-8 names round-trip, as in webdataset
            offsets.append(sample.offset)
            sizes.append(sample.end - sample.offset)
            end = sample.end
    except OSError as exc:
        raise ShardError(f"cannot read shard {url} (indexed {len(keys)} samples before the error): {exc}") from None
    finally:
        f.close()
    if seekable or remote:
        file_size = stat["size"] if remote else os.path.getsize(local_path(url))
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


def _stat(url: str, storage_options: dict | None, retry: RetryPolicy | None) -> dict:
    return remote_stat(url, storage_options, retry) if is_remote(url) else shard_stat(url, storage_options)


def _index_one(url: str, path: str, spec: LengthSpec | None = None, storage_options: dict | None = None,
               stat: dict | None = None, retry: RetryPolicy | None = None,
               ranges: RangeNotice | None = None) -> tuple[np.ndarray, dict]:
    spec = spec or _WORKER_SPEC
    stat = stat or _stat(url, storage_options, retry)  # before the scan: a shard changed meanwhile then shows as stale
    if stat:
        arrays = index_shard(url, spec, storage_options, stat, retry=retry, ranges=ranges)
    else:  # a pipe is read whole by the scan: take its content digest on the way
        h = content_hasher()
        arrays = index_shard(url, spec, hasher=h)
        stat = {"content": h.hexdigest()}
    meta = write_sidecar(path, url, arrays, spec, stat, storage_options, retry=retry)
    return arrays["lengths"], meta


def _current(url: str, path: str, spec: LengthSpec, storage_options: dict | None, retry: RetryPolicy | None = None):
    """(lengths, meta, stat) of a sidecar that still describes its shard, or (None, None, stat)."""
    stat = remote_stat(url, storage_options, retry) if is_remote(url) else None
    try:
        if not exists(path, storage_options, retry):
            return None, None, stat
        with SidecarFile(path, storage_options, retry=retry) as sc:
            if sc.meta["length_from"] == spec.describe() and staleness(url, sc.meta, stat) is None:
                return sc.lengths(), sc.meta, stat
    except (ShardError, OSError):
        pass  # unreadable or invalid: index it again
    return None, None, stat


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


@scrubbing
def index_shards(urls: UrlsLike, *, length_from: LengthFrom = "json:duration", frames_per_second: float | None = None,
                 index_dir: str | None = None, workers: IntLike | None = None, progress: bool = True,
                 force: bool = False, storage_options: dict[str, Any] | None = None,
                 part: str | tuple[int, int] | None = None, catalog: str | bool | None = None,
                 retry: RetryPolicy | int | None = None) -> IndexSummary:
    """Write a sidecar for every shard that lacks a current one, then the
    dataset's catalog file.

    urls: a brace pattern, a path or a list of shard URLs (local, ``pipe:``
        or any fsspec URL: ``s3://``, ``gs://``, ``https://``, ``hf://``).
    length_from / frames_per_second: see ``LengthSpec``.
    index_dir: where sidecars go (local or remote; default next to each shard).
    workers: shards scanned in parallel (default: CPU count for local shards,
        processes; 16 threads for remote shards, which wait on the network).
        1 scans in this process, which also allows lambdas as ``length_from``.
    force: re-index shards even when their sidecar is current.
    storage_options: fsspec options for remote shards and sidecars.
    part: ``(i, n)`` or ``"i/n"``: index only shards k with k % n == i
        (one of n machines) and write catalog part i; merge the parts with
        ``merge_catalog``. None: every shard, then the catalog itself.
    catalog: path/URL of the catalog file to write, True for the default
        ``<index_dir or the first shard's directory>/streambatch.catalog.npz``,
        False for none; None (default): the default path when any shard is
        remote or ``part`` is given, else none.
    retry: ``RetryPolicy`` (or a number of retries) of every remote request:
        its ``timeout`` bounds each wait for a server (default 60 s).
    A sidecar written with another ``length_from`` counts as stale. A server
    that ignores Range requests has its shards streamed whole, with a warning.
    """
    t0 = time.perf_counter()
    retry = as_policy(retry)
    ranges = RangeNotice()
    all_urls = expand_urls(urls)
    _check_padding(urls, all_urls)
    spec = length_spec(length_from, frames_per_second)
    i_part, n_parts = parse_part(part)
    urls = all_urls[i_part::n_parts]
    remote = any(is_remote(u) for u in urls)
    default_workers = 16 if remote else (os.cpu_count() or 1)
    workers = check_int("workers", default_workers if workers is None else workers, 1)
    paths = [sidecar_path(u, index_dir, for_write=True) for u in urls]
    if catalog is None:
        catalog = remote or n_parts > 1
    if catalog is not False:
        check_entries(urls)  # before any work: a name the catalog cannot hold
        check_entries(paths, "sidecar")
    todo, lengths, metas, stats = [], {}, {}, {}
    if force:
        todo = list(range(len(urls)))
    else:
        checks = _map(lambda i: _current(urls[i], paths[i], spec, storage_options, retry), range(len(urls)),
                      workers if remote else 1)
        for i, (got, meta, stat) in enumerate(checks):
            if got is None:
                todo.append(i)
                stats[i] = stat
            else:
                lengths[i], metas[i] = got, meta
    bar = _progress(len(todo), progress and bool(todo))
    try:
        if remote or workers == 1 or len(todo) <= 1:
            # Remote shards: threads (the work is waiting on ranged reads).
            def one(i):
                return i, _index_one(urls[i], paths[i], spec, storage_options, stats.get(i), retry, ranges)

            for i, (got, meta) in _map(one, todo, 1 if len(todo) <= 1 else workers, ordered=False):
                lengths[i], metas[i] = got, meta
                if bar:
                    bar.update(1)
        else:
            import multiprocessing as mp

            # fork passes the spec to workers by inheritance, so lambdas work too.
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
            with ProcessPoolExecutor(min(workers, len(todo)), mp_context=ctx, initializer=_init_worker,
                                     initargs=(spec,)) as pool:
                futures = {pool.submit(_index_one, urls[i], paths[i]): i for i in todo}
                for fut in as_completed(futures):
                    lengths[futures[fut]], metas[futures[fut]] = fut.result()
                    if bar:
                        bar.update(1)
    finally:
        if bar:
            bar.close()
    if catalog is not False and urls:
        target = os.fspath(catalog) if not isinstance(catalog, bool) else default_catalog_path(all_urls, index_dir)
        at = target if n_parts == 1 else part_path(target, i_part, n_parts)
        meta, arrays = catalog_arrays(urls, paths, [metas[i] for i in range(len(urls))],
                                      [lengths[i] for i in range(len(urls))], spec.describe(), at=at)
        write_catalog(at, meta, arrays, storage_options, retry=retry)
    every = np.concatenate([lengths[i] for i in range(len(urls))]) if urls else np.zeros(0, np.int64)
    qs = {"min": 0, "p5": 5, "p50": 50, "p95": 95, "max": 100}
    pct = {k: int(np.percentile(every, q, method="nearest")) for k, q in qs.items()} if every.size else {}
    return IndexSummary(len(urls), len(todo), len(urls) - len(todo), int(every.size), int(every.sum()), pct,
                        time.perf_counter() - t0)


def _check_padding(given: Any, urls: list[str]) -> None:
    """A brace range written without the files' zero padding (``{0..7}`` for ``{000000..000007}``) names files
    that are not there: say so, with the pattern that names the files, before any work."""
    for pattern in [given] if isinstance(given, str) else [g for g in given if isinstance(g, str)]:
        fixed = padding_fix(pattern)
        gone = [u for u in expand_urls(pattern) if is_local(u) and not os.path.lexists(local_path(u))] if fixed else []
        if gone:
            example = os.path.basename(expand_urls(fixed)[0])
            raise ShardError(f"no such file: {gone[0]} ({len(gone)} of {len(urls)} shards are missing); the files "
                             f"there are numbered with zero padding ({example}): write the pattern as {fixed!r} (a "
                             "brace range keeps the digits it is written with)")


def parse_part(part: Any) -> tuple[int, int]:
    """(i, n) from None (0, 1), ``(i, n)`` or ``"i/n"``, checked: 0 <= i < n."""
    if part is None:
        return 0, 1
    if isinstance(part, str):
        i, sep, n = part.partition("/")
        if not sep or not i.strip().isdigit() or not n.strip().isdigit():
            raise ValueError(f"part must look like I/N (e.g. 3/16: the 4th of 16 machines), got {part!r}")
        part = (int(i), int(n))
    if (not isinstance(part, (tuple, list)) or len(part) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in part)):
        raise ValueError(f"part must be (i, n) or 'i/n', got {part!r}")
    i, n = part
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"part {i}/{n} is out of range: need N >= 1 and 0 <= I < N (parts count from 0)")
    return i, n


@scrubbing
def merge_catalog(urls: UrlsLike, parts: int, *, index_dir: str | None = None, catalog: str | None = None,
                  storage_options: dict[str, Any] | None = None,
                  retry: RetryPolicy | int | None = None) -> dict[str, Any]:
    """Merge the ``parts`` catalog parts written by ``index_shards(part=...)``
    into the catalog (``retry``: as for ``index_shards``). Returns the catalog's meta."""
    target = os.fspath(catalog) if catalog else default_catalog_path(expand_urls(urls), index_dir)
    return merge_parts(target, parts, storage_options, retry=as_policy(retry))


def _map(fn, items, workers: int, ordered: bool = True):
    """fn over items in this thread (workers == 1) or a thread pool."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        yield from (fn(x) for x in items)
        return
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        if ordered:
            yield from pool.map(fn, items)
        else:
            for fut in as_completed([pool.submit(fn, x) for x in items]):
                yield fut.result()
