"""Sidecar indexes: one small file per shard listing its samples.

A sidecar ``<shard>.idx.npz`` (next to a local shard, or in ``index_dir``)
holds, for the N samples of the shard in tar order:

- ``keys``: (N,) bytes, the UTF-8 sample keys (webdataset's grouping);
- ``lengths``: (N,) int64, the planning length of each sample;
- ``offsets``: (N,) int64, byte offset of the sample's first tar header;
- ``sizes``: (N,) int64, bytes from there to the end of its last member;
- ``meta``: UTF-8 JSON: format version, shard size/mtime/fingerprint (to
  detect a stale sidecar), how lengths were computed, and a digest.

``np.load`` reads npz members lazily, so planning reads only ``lengths``.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .audio import HEADER_BYTES, NeedMoreBytes, audio_ext, audio_info
from .shards import ShardError, TarScanner, is_local, local_path, member_key, open_shard, url_basename

SIDECAR_SUFFIX = ".idx.npz"
FORMAT = "streambatch-index"
VERSION = 1
_PROBE = 64 * 1024


# ---------------------------------------------------------------- lengths


@dataclass(frozen=True)
class LengthSpec:
    """Where a sample's planning length comes from.

    ``json:FIELD`` (dotted path into the ``.json`` member), ``audio`` (frame
    count of the first audio member, from its header) or ``audio:SUFFIX``, or
    a function of the raw sample dict. With ``frames_per_second`` the value is
    seconds and the length is ``ceil(seconds * frames_per_second)``; without
    it the value must already be an integer count.
    """

    source: str
    field: tuple[str, ...] = ()
    suffix: str | None = None
    fn: Callable[[dict], Any] | None = None
    frames_per_second: float | None = None

    def describe(self) -> str:
        if self.source == "json":
            base = "json:" + ".".join(self.field)
        elif self.source == "audio":
            base = "audio" + (f":{self.suffix}" if self.suffix else "")
        else:
            base = f"fn:{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}"
        return base if self.frames_per_second is None else f"{base}*{self.frames_per_second:g}/s"

    def needs_all_members(self) -> bool:
        return self.source == "fn"

    def wants(self, suffix: str) -> bool:
        """Does computing the length need (part of) this member?"""
        if self.source == "json":
            return suffix == "json" or suffix.endswith(".json")
        if self.source == "audio":
            return (suffix == self.suffix) if self.suffix else audio_ext(suffix) is not None
        return True

    def to_length(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{where}: length source {self.describe()!r} gave {value!r}, not a number")
        v = float(value)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}: length source {self.describe()!r} gave {value!r}; lengths must be finite and >= 0")
        if self.frames_per_second is not None:
            # A tiny tolerance keeps 0.07 s * 100/s at 7 frames, not 8.
            return max(0, math.ceil(v * self.frames_per_second - 1e-6))
        if v != math.floor(v):
            raise ValueError(
                f"{where}: length source {self.describe()!r} gave {value!r}, a fraction; pass "
                "frames_per_second (e.g. 50) to turn seconds into frame counts"
            )
        return int(v)


def length_spec(length_from: Any = "json:duration", frames_per_second: Any = None) -> LengthSpec:
    """Validate ``length_from`` / ``frames_per_second`` into a LengthSpec."""
    if isinstance(length_from, LengthSpec):
        return length_from
    fps = None
    if frames_per_second is not None:
        if isinstance(frames_per_second, bool) or not isinstance(frames_per_second, numbers.Real) \
                or not math.isfinite(frames_per_second) or frames_per_second <= 0:
            raise ValueError(f"frames_per_second must be a finite number > 0 (e.g. 50 or 100), got {frames_per_second!r}")
        fps = float(frames_per_second)
    if callable(length_from):
        return LengthSpec("fn", fn=length_from, frames_per_second=fps)
    if isinstance(length_from, str):
        if length_from.startswith("json:") and len(length_from) > 5:
            return LengthSpec("json", field=tuple(length_from[5:].split(".")), frames_per_second=fps)
        if length_from == "audio":
            return LengthSpec("audio", frames_per_second=fps)
        if length_from.startswith("audio:") and len(length_from) > 6:
            return LengthSpec("audio", suffix=length_from[6:].lower(), frames_per_second=fps)
    raise ValueError(
        f"length_from must be 'json:FIELD' (e.g. 'json:duration'), 'audio', 'audio:SUFFIX' or a function "
        f"of the sample dict, got {length_from!r}"
    )


def _length_of(spec: LengthSpec, members: dict[str, bytes], sizes: dict[str, int], reread, where: str) -> int:
    if spec.source == "fn":
        return spec.to_length(spec.fn(members), where)
    if spec.source == "json":
        name = next((s for s in members if spec.wants(s)), None)
        if name is None:
            raise ValueError(f"{where}: no .json member to read {spec.describe()!r} from; choose another length_from")
        try:
            value = json.loads(members[name])
            for part in spec.field:
                value = value[part]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{where}: cannot read field {'.'.join(spec.field)!r} of member {name!r}: {exc!r}") from None
        return spec.to_length(value, where)
    name = next((s for s in members if spec.wants(s)), None)
    if name is None:
        raise ValueError(f"{where}: no audio member ({spec.suffix or '/'.join(('flac', 'wav', 'ogg', 'opus', 'mp3'))}) to measure")
    ext = audio_ext(name) or spec.suffix
    try:
        try:
            frames, rate = audio_info(members[name], ext, sizes[name])
        except NeedMoreBytes:
            frames, rate = audio_info(reread(name), ext, sizes[name])
    except (ValueError, RuntimeError) as exc:
        raise ValueError(f"{where}: cannot read the header of audio member {name!r}: {exc}") from None
    if spec.frames_per_second is None:
        return frames
    return spec.to_length(frames / rate, where)


# ---------------------------------------------------------------- one shard


def shard_fingerprint(path: str, size: int) -> str:
    """Hash of a file's size, first and last 64 KiB: recognises a copied shard
    whose mtime changed, cheaply."""
    h = hashlib.blake2b(str(size).encode(), digest_size=8)
    with open(path, "rb") as f:
        h.update(f.read(_PROBE))
        if size > _PROBE:
            f.seek(max(_PROBE, size - _PROBE))
            h.update(f.read(_PROBE))
    return h.hexdigest()


def index_shard(url: str, spec: LengthSpec) -> dict[str, np.ndarray]:
    """Scan one shard and return its sidecar arrays (see module docstring).

    Local shards are scanned by seeking from header to header, reading only
    the members (or member heads) that ``spec`` needs; streams are read whole.
    """
    seekable = is_local(url)
    keys: list[bytes] = []
    lengths: list[int] = []
    offsets: list[int] = []
    sizes: list[int] = []
    cur_key = None
    cur: dict[str, bytes] = {}
    cur_sizes: dict[str, int] = {}
    cur_at: dict[str, int] = {}
    start = end = 0
    f = open_shard(url, seekable)

    def finish():
        where = f"shard {url}, sample {cur_key!r} at byte {start}"

        def reread(name):  # a header longer than HEADER_BYTES: fetch the whole member
            here = f.tell()
            f.seek(cur_at[name])
            data = f.read(cur_sizes[name])
            f.seek(here)
            return data

        lengths.append(_length_of(spec, cur, cur_sizes, reread, where))
        keys.append(cur_key.encode("utf-8"))
        offsets.append(start)
        sizes.append(end - start)

    try:
        scanner = TarScanner(f, url)
        for entry in scanner:
            if not entry.regular:
                continue
            key, suffix = member_key(entry.name)
            if key is None:
                continue
            if key != cur_key:
                if cur_key is not None:
                    finish()
                cur_key, cur, cur_sizes, cur_at = key, {}, {}, {}
                start = entry.offset
            if suffix in cur_sizes:
                raise ShardError(f"shard {url} has two {suffix!r} members for sample {key!r} at byte {entry.offset}")
            cur_sizes[suffix] = entry.size
            cur_at[suffix] = entry.data_offset
            if spec.needs_all_members() or spec.wants(suffix):
                head_only = seekable and not spec.needs_all_members() and audio_ext(suffix) in ("wav", "flac")
                cur[suffix] = scanner.read_data(HEADER_BYTES if head_only else None)
            end = entry.end
        if cur_key is not None:
            finish()
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


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for name in ("keys", "lengths", "offsets", "sizes"):
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def sidecar_path(url: str, index_dir: str | None = None) -> str:
    """Where the sidecar of ``url`` lives: next to a local shard, or in
    ``index_dir`` under the shard's file name (required for remote shards)."""
    if index_dir is not None:
        return os.path.join(os.fspath(index_dir), url_basename(url) + SIDECAR_SUFFIX)
    if not is_local(url):
        raise ValueError(
            f"shard {url!r} is not a local file, so its sidecar cannot sit next to it; pass index_dir= "
            "(a local directory for the sidecars) when indexing and when streaming"
        )
    return local_path(url) + SIDECAR_SUFFIX


def shard_stat(url: str) -> dict[str, Any]:
    """Identity of a local shard (size, mtime, fingerprint); {} for streams."""
    if not is_local(url):
        return {}
    path = local_path(url)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ShardError(f"cannot open shard {url}: {exc}") from None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "fingerprint": shard_fingerprint(path, st.st_size)}


def write_sidecar(path: str, url: str, arrays: dict[str, np.ndarray], spec: LengthSpec, stat: dict) -> dict:
    """Write a sidecar atomically (temp file + rename), so concurrent indexers
    of the same shard never leave a torn file. Returns its meta."""
    meta = {"format": FORMAT, "version": VERSION, "url": url, "samples": int(arrays["lengths"].size),
            "length_from": spec.describe(), "digest": _digest(arrays), **stat}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=SIDECAR_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a sidecar is as readable as its shard
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return meta


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_meta(path: str) -> dict:
    with np.load(path) as z:
        meta = json.loads(z["meta"].tobytes().decode())
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{path} is not a streambatch sidecar of version {VERSION}; re-index with `streambatch index --force`")
    return meta


def read_arrays(path: str, names: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    with np.load(path) as z:
        return tuple(z[n] for n in names)


def staleness(url: str, meta: dict, stat: dict | None = None) -> str | None:
    """Why the sidecar no longer describes the shard, or None if it is current.

    Size must match; a changed mtime is forgiven when the head/tail
    fingerprint matches (a copy). Streams cannot be checked here: a mismatch
    shows up when a sample's key differs from the sidecar's.
    """
    if not is_local(url):
        return None
    path = local_path(url)
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot stat the shard ({exc})"
    if st.st_size != meta.get("size"):
        return f"the shard has {st.st_size} bytes, the sidecar was written for {meta.get('size')}"
    if st.st_mtime_ns == meta.get("mtime_ns"):
        return None
    fp = (stat or {}).get("fingerprint") or shard_fingerprint(path, st.st_size)
    if fp != meta.get("fingerprint"):
        return "the shard's content changed since it was indexed"
    return None


# ---------------------------------------------------------------- many shards


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
    from .shards import expand_urls
    from ..validation import check_int

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
