"""The shard catalog: every shard's URL and sidecar, checked once up front.

Holds O(shards) metadata only (sample counts, digests). Per-sample arrays are
read from the sidecars window by window, so memory follows the window.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .lengths import length_spec
from .reader import expand_urls, is_local
from .catalog_file import is_catalog, read_catalog
from .remote_index import exists
from .sidecar import read_arrays, read_meta, sidecar_path, staleness


@dataclass(frozen=True)
class Catalog:
    """urls: shard URLs in the order given; sidecars: their sidecar paths;
    counts: (S,) int64 samples per shard; digests: per-sidecar content hash.

    From a catalog file (``catalog_file.py``) also: sizes (S,) int64 (-1:
    unknown) and etags of the shards as indexed, and every planning length
    (``packed``, shard after shard; ``starts`` (S + 1,) int64 cut points),
    so planning opens no sidecar. storage_options reach remote sidecars.
    """

    urls: tuple[str, ...]
    sidecars: tuple[str, ...]
    counts: np.ndarray
    digests: tuple[str, ...]
    sizes: np.ndarray | None = None
    etags: tuple[str, ...] | None = None
    packed: np.ndarray | None = None
    starts: np.ndarray | None = None
    storage_options: dict | None = field(default=None, repr=False, compare=False)

    @property
    def num_samples(self) -> int:
        return int(self.counts.sum())

    def lengths(self, shard: int) -> np.ndarray:
        """(n,) int64 planning lengths of one shard's samples, in tar order."""
        if self.packed is not None:
            return self.packed[self.starts[shard] : self.starts[shard + 1]].astype(np.int64)
        (lengths,) = read_arrays(self.sidecars[shard], ("lengths",), self.storage_options)
        self._check(shard, lengths)
        return lengths

    def table(self, shard: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys (n,) bytes, offsets (n,) int64, sizes (n,) int64) of one shard."""
        keys, offsets, sizes = read_arrays(self.sidecars[shard], ("keys", "offsets", "sizes"), self.storage_options)
        self._check(shard, keys)
        return keys, offsets, sizes

    def _check(self, shard: int, arr: np.ndarray) -> None:
        # The sidecar was replaced after the catalog was opened: every rank must
        # plan from the same sidecars, so refuse rather than plan differently.
        if arr.shape[0] != self.counts[shard]:
            raise ValueError(
                f"sidecar {self.sidecars[shard]} changed while streaming ({arr.shape[0]} samples, "
                f"{self.counts[shard]} when opened); do not re-index shards during training"
            )

    def fingerprint(self) -> str:
        """Hash of URLs and sidecar digests: equal on ranks that see the same data."""
        h = hashlib.blake2b(digest_size=8)
        for url, digest in zip(self.urls, self.digests):
            h.update(url.encode("utf-8", "surrogateescape") + b"\0" + digest.encode() + b"\0")
        return h.hexdigest()


def open_catalog(urls: Any, *, index_dir: str | None = None, index_missing: bool = False,
                 length_from: Any = None, frames_per_second: Any = None, index_workers: int | None = 1,
                 url_hint: str | None = None, storage_options: dict | None = None) -> Catalog:
    """Find and check every shard's sidecar, or read a catalog file
    (``urls`` = ``.../NAME.catalog.npz``, local or remote: one request).

    A missing or stale sidecar is an error naming the ``streambatch index``
    command to run; with ``index_missing`` local shards are indexed here
    instead (``length_from`` then says how). If ``length_from`` is given,
    sidecars written with another length source count as stale.
    """
    if is_catalog(urls):
        return _from_file(os.fspath(urls), length_from, frames_per_second, storage_options)
    urls = expand_urls(urls)
    paths = [sidecar_path(u, index_dir) for u in urls]
    dup = _first_duplicate(paths)
    if dup is not None:
        raise ValueError(
            f"shards {urls[dup[0]]!r} and {urls[dup[1]]!r} would share the sidecar {paths[dup[0]]}; "
            "shards indexed into one index_dir need distinct file names"
        )
    spec = length_spec(length_from, frames_per_second) if length_from is not None else None
    bad: list[tuple[int, str]] = []
    metas: list[dict | None] = []
    for i, (url, path) in enumerate(zip(urls, paths)):
        meta = None
        if not exists(path, storage_options):
            bad.append((i, "no sidecar"))
        else:
            try:
                meta = read_meta(path, storage_options)
            except Exception as exc:
                bad.append((i, f"unreadable sidecar ({exc})"))
            else:
                why = staleness(url, meta)
                if why is None and spec is not None and meta.get("length_from") != spec.describe():
                    why = f"lengths came from {meta.get('length_from')!r}, not {spec.describe()!r}"
                if why is not None:
                    bad.append((i, f"stale sidecar: {why}"))
                    meta = None
        metas.append(meta)
    if bad:
        fixable = [i for i, _ in bad if is_local(urls[i])]
        if index_missing and len(fixable) == len(bad):
            from .indexer import index_shards

            index_shards([urls[i] for i in fixable], length_from=spec or length_spec(), index_dir=index_dir,
                         workers=index_workers, progress=False, force=True)
            for i in fixable:
                metas[i] = read_meta(paths[i])
        else:
            raise FileNotFoundError(_missing_message(urls, bad, index_dir, index_missing, url_hint, spec))
    counts = np.array([m["samples"] for m in metas], dtype=np.int64)
    sizes = np.array([m["size"] if m.get("size") is not None else -1 for m in metas], dtype=np.int64)
    return Catalog(tuple(urls), tuple(paths), counts, tuple(m["digest"] for m in metas), sizes,
                   tuple(m.get("etag") or "" for m in metas), storage_options=storage_options)


def _from_file(path: str, length_from: Any, frames_per_second: Any, storage_options: dict | None) -> Catalog:
    c = read_catalog(path, storage_options)
    if length_from is not None:
        want = length_spec(length_from, frames_per_second).describe()
        if c["meta"]["length_from"] != want:
            raise ValueError(f"catalog {path} holds lengths from {c['meta']['length_from']!r}, not {want!r}; "
                             "re-index with the same --length-from/--frames-per-second or drop length_from")
    starts = np.concatenate([[0], np.cumsum(c["counts"])]).astype(np.int64)
    return Catalog(tuple(c["urls"]), tuple(c["sidecars"]), c["counts"].astype(np.int64), tuple(c["digests"]),
                   c["sizes"], tuple(c["etags"]), c["lengths"], starts, storage_options)


def _first_duplicate(paths: list[str]) -> tuple[int, int] | None:
    seen: dict[str, int] = {}
    for i, p in enumerate(paths):
        if p in seen:
            return seen[p], i
        seen[p] = i
    return None


def _missing_message(urls, bad, index_dir, index_missing, url_hint, spec) -> str:
    i, why = bad[0]
    target = url_hint if isinstance(url_hint, str) else (urls[i] if len(bad) == 1 else "SHARDS...")
    opts = f" --index-dir {index_dir}" if index_dir else ""
    if spec is not None:
        opts += _spec_flags(spec)
    stale = any(w.startswith("stale") for _, w in bad)
    cmd = f"streambatch index{' --force' if stale else ''}{opts} '{target}'"
    msg = (f"{len(bad)} of {len(urls)} shards have no usable sidecar index (first: {urls[i]}: {why}); "
           f"run `{cmd}` (or streambatch.index_shards(...)) first")
    remote = [j for j, _ in bad if not is_local(urls[j])]
    if remote:
        msg += f"; {len(remote)} of them are not local files and must be indexed ahead of time"
    elif not index_missing:
        msg += ", or pass index_missing=True to index local shards on the fly"
    return msg


def _spec_flags(spec) -> str:
    if spec.source == "fn":
        return ""  # a Python function has no command-line spelling; index_shards takes it
    src = "json:" + ".".join(spec.field) if spec.source == "json" else "audio" + (f":{spec.suffix}" if spec.suffix else "")
    fps = f" --frames-per-second {spec.frames_per_second:g}" if spec.frames_per_second is not None else ""
    return f" --length-from {src}{fps}"
