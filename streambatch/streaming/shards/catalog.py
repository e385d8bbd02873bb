"""The shard catalog: every shard's URL and sidecar, checked once up front.

Holds O(shards) metadata (sample counts, sidecar digests) plus every
sample's planning length as read at open time, in the narrowest integer type
that fits (2 bytes per sample for lengths < 65,536, else 4 or 8: 200 MB for
100M short utterances). Planning never re-reads lengths, so a sidecar
rewritten while a job runs (another ``--frames-per-second``, ``--force``)
cannot make ranks plan differently. The keys and byte positions needed to
read samples are read window by window and checked against the sidecar
digest recorded at open: a shard re-indexed with other positions is a
``ShardError``, never a silent mix of old and new. Which shards are local
files is decided once per shard (``Catalog.local``).

Stream: a ``Catalog``: per shard its URL, sidecar, sample count and lengths; its sample table on demand.
"""

from __future__ import annotations

import errno
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ...core.redact import scrub, scrub_url, scrubbing
from ...core.types import IntLike, LengthFrom, UrlsLike
from ..errors import ShardError
from ..io.objects import is_remote
from ..io.ranged import exists
from ..io.reader import check_regular
from ..io.retry import RetryPolicy
from ..io.urls import expand_urls, is_local, local_path, padding_fix
from .catalog_file import is_catalog, read_catalog
from .catalog_trust import TrustLike, check_trust
from .hints import index_command
from .identity import VERIFY_MODES, staleness
from .indexer import index_shards
from .lengths import length_spec
from .sidecar import SidecarFile, _digest, sidecar_path

_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


@dataclass(frozen=True, eq=False)
class Catalog:
    """urls: shard URLs in the order given; sidecars: their sidecar paths;
    counts: (S,) int64 samples per shard; digests: per-sidecar content hash,
    as opened. ``lengths(s)`` comes from memory, ``table(s)`` from the sidecar.
    sizes: (S,) int64 shard bytes as indexed (-1: unknown) and etags (S,) str
    ('' : unknown), for remote shards; storage_options reach remote sidecars.
    A catalog file (``catalog_file.py``) gives all of these in one read.
    layouts: per shard, how a corpus format other than WebDataset reads it
    (``corpora/base.Layout``: its sample table and sample dicts), or None for
    every shard: WebDataset tars with sidecars."""

    urls: tuple[str, ...]
    sidecars: tuple[str, ...]
    counts: np.ndarray
    digests: tuple[str, ...]
    all_lengths: np.ndarray = field(repr=False)  # (N,) uint16/uint32/int64, shard after shard
    starts: np.ndarray = field(repr=False)  # (S + 1,) int64 offsets of each shard's lengths
    sizes: np.ndarray | None = field(default=None, repr=False)
    etags: tuple[str, ...] | None = field(default=None, repr=False)
    storage_options: dict | None = field(default=None, repr=False)
    layouts: tuple[Any, ...] | None = field(default=None, repr=False)

    @property
    def num_samples(self) -> int:
        return int(self.counts.sum())

    @cached_property
    def local(self) -> np.ndarray:
        """(S,) bool: shard s is a local file, read by offset (``os.pread``); else
        a remote object or a stream, read through the node-local cache (a remote
        Parquet file too: its row groups). Decided once per shard, here."""
        return np.array([is_local(u) for u in self.urls], dtype=bool)

    def layout(self, shard: int) -> Any:
        """The layout that reads shard ``shard`` (``corpora/base.Layout``), or None: a WebDataset tar."""
        return self.layouts[shard] if self.layouts is not None else None

    def lengths(self, shard: int) -> np.ndarray:
        """(n,) int64 planning lengths of one shard's samples, in tar order,
        as they were when the catalog was opened."""
        return self.all_lengths[self.starts[shard] : self.starts[shard + 1]].astype(np.int64)

    def table(self, shard: int, copy: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys (n,) bytes, offsets (n,) int64, sizes (n,) int64) of one
        shard, validated, and the same as when the catalog was opened.
        ``copy``: a local copy of a remote sidecar to read instead. A shard of
        another corpus format gets its table from its layout."""
        layout = self.layout(shard)
        if layout is not None:
            return layout.table(self, shard, copy)
        path, url = self.sidecars[shard], self.urls[shard]
        try:
            with SidecarFile(copy or path, self.storage_options) as sc:
                keys, offsets, sizes = sc.table()
        except OSError as exc:
            if exc.errno in _OUT_OF_RESOURCES:
                raise  # not a broken shard: on_error="skip" must not hide it
            raise ShardError(f"cannot read sidecar {path} of shard {url}: {exc}") from exc
        arrays = {"keys": keys, "lengths": self.lengths(shard), "offsets": offsets, "sizes": sizes}
        if keys.shape[0] != self.counts[shard] or _digest(arrays) != self.digests[shard]:
            raise ShardError(
                f"sidecar {path} changed since this job opened it: the keys or byte positions of shard {url}'s "
                "samples differ (the shard was replaced and re-indexed, or the sidecar damaged); the job cannot "
                "read that shard's samples as planned. Do not replace shards during training; restart the job"
            )
        return keys, offsets, sizes

    def __repr__(self) -> str:
        # URLs may carry credentials (user-info, signed queries): scrubbed, and only the first shown
        first = f", first={scrub_url(self.urls[0])!r}" if self.urls else ""
        return f"Catalog(shards={len(self.urls)}, samples={self.num_samples}{first})"

    def fingerprint(self) -> str:
        """Hash of URLs and sidecar digests: equal on ranks that see the same data."""
        h = hashlib.blake2b(digest_size=8)
        for url, digest in zip(self.urls, self.digests):
            h.update(url.encode("utf-8", "surrogateescape") + b"\0" + digest.encode() + b"\0")
        return h.hexdigest()


def _narrow(lengths: np.ndarray) -> np.ndarray:
    top = int(lengths.max()) if lengths.size else 0
    for dtype in (np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return lengths.astype(dtype)
    return lengths


def _load(url: str, path: str, spec, storage_options: dict | None = None,
          retry: RetryPolicy | None = None) -> tuple[dict, np.ndarray | None, str | None]:
    """(meta, lengths, why unusable) of one sidecar; lengths only if usable."""
    if not exists(path, storage_options, retry):
        return {}, None, "no sidecar"
    try:
        with SidecarFile(path, storage_options, retry) as sc:
            why = staleness(url, sc.meta, verify="stat")
            if why is None and spec is not None and sc.meta["length_from"] != spec.describe():
                why = f"lengths came from {sc.meta['length_from']!r}, not {spec.describe()!r}"
            if why is not None:
                return sc.meta, None, f"stale sidecar: {why}"
            sc.header_check()  # every array's dtype and shape, before planning from this sidecar
            return sc.meta, _narrow(sc.lengths()), None
    except ShardError as exc:
        return {}, None, f"unreadable sidecar ({exc})"
    except OSError as exc:
        if exc.errno in _OUT_OF_RESOURCES:
            raise
        return {}, None, f"unreadable sidecar ({exc})"


@scrubbing
def open_catalog(urls: UrlsLike, *, index_dir: str | None = None, index_missing: bool = False,
                 length_from: LengthFrom | None = None, frames_per_second: float | None = None,
                 index_workers: IntLike | None = 1,
                 url_hint: str | None = None, verify: str = "stat", storage_options: dict | None = None,
                 trust_catalog: TrustLike = False, retry: RetryPolicy | None = None) -> Catalog:
    """Find and check every shard's sidecar, and read every sample's length;
    or read a catalog file (``urls`` = ``.../NAME.catalog.npz``, local or
    remote: one request, no sidecar opened).

    A missing, stale or invalid sidecar is an error naming the ``streambatch
    index`` command to run; with ``index_missing`` local shards are indexed
    here instead (``length_from`` then says how). If ``length_from`` is given,
    sidecars written with another length source count as stale. ``verify``:
    ``"stat"`` (size, mtime, head/tail probe) or ``"full"`` (also re-hash
    every shard and compare with the content digest taken at index time; see
    ``shard_identity.py`` for what each guarantees). ``trust_catalog``: what
    the entries of a catalog file may be beyond its own storage's URLs
    (``catalog_trust.py``; True: anything, ``pipe:`` commands included).
    ``retry``: the ``RetryPolicy`` of remote catalog and sidecar reads (its
    timeout bounds each wait).
    """
    trust = check_trust(trust_catalog)
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if is_catalog(urls):
        path = os.fspath(urls)
        return from_contents(path, read_catalog(path, storage_options, trust=trust, retry=retry), length_from,
                             frames_per_second, storage_options)
    return open_urls(expand_urls(urls), index_dir=index_dir, index_missing=index_missing, length_from=length_from,
                     frames_per_second=frames_per_second, index_workers=index_workers, url_hint=url_hint,
                     verify=verify, storage_options=storage_options, retry=retry)


def open_urls(urls: list[str], *, index_dir: str | None = None, index_missing: bool = False,
              length_from: LengthFrom | None = None, frames_per_second: float | None = None,
              index_workers: IntLike | None = 1, url_hint: str | None = None, verify: str = "stat",
              storage_options: dict | None = None, retry: RetryPolicy | None = None) -> Catalog:
    """``open_catalog`` of an expanded list of shard URLs (``io/urls.expand_urls``), from their sidecars."""
    _check_shards_exist(urls, url_hint)
    paths = [sidecar_path(u, index_dir) for u in urls]
    dup = _first_duplicate(paths)
    if dup is not None:
        raise ValueError(scrub(
            f"shards {urls[dup[0]]!r} and {urls[dup[1]]!r} would share the sidecar {paths[dup[0]]}; "
            "shards indexed into one index_dir need distinct file names"
        ))
    spec = length_spec(length_from, frames_per_second) if length_from is not None else None
    if any(is_remote(p) for p in paths):  # one request each: overlap them
        with ThreadPoolExecutor(16) as pool:
            loaded = list(pool.map(lambda up: _load(up[0], up[1], spec, storage_options, retry), zip(urls, paths)))
    else:
        loaded = [_load(url, path, spec) for url, path in zip(urls, paths)]
    if verify == "full":
        ok = [i for i, (_, lens, _) in enumerate(loaded) if lens is not None]
        with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # hashing and reads release the GIL
            whys = list(pool.map(lambda i: staleness(urls[i], loaded[i][0], verify="full"), ok))
        for i, why in zip(ok, whys):
            if why is not None:
                loaded[i] = ({}, None, f"stale sidecar: {why}")
    bad = [(i, why) for i, (_, _, why) in enumerate(loaded) if why is not None]
    if bad:
        fixable = [i for i, _ in bad if is_local(urls[i])]
        if index_missing and len(fixable) == len(bad):
            index_shards([urls[i] for i in fixable], length_from=spec or length_spec(), index_dir=index_dir,
                         workers=index_workers, progress=False, force=True)
            for i in fixable:
                with SidecarFile(paths[i]) as sc:
                    loaded[i] = (sc.meta, _narrow(sc.lengths()), None)
        else:
            raise FileNotFoundError(scrub(_missing_message(urls, bad, index_dir, index_missing, url_hint, spec)))
    counts = np.array([m["samples"] for m, _, _ in loaded], dtype=np.int64)
    parts = [lens for _, lens, _ in loaded]
    all_lengths = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    sizes = np.array([m["size"] if m.get("size") is not None else -1 for m, _, _ in loaded], dtype=np.int64)
    return Catalog(tuple(urls), tuple(paths), counts, tuple(m["digest"] for m, _, _ in loaded), all_lengths, starts,
                   sizes, tuple(m.get("etag") or "" for m, _, _ in loaded), storage_options)


def from_contents(path: str, c: dict[str, Any], length_from: Any, frames_per_second: Any,
                  storage_options: dict | None) -> Catalog:
    """The Catalog of a catalog file's contents (``catalog_file.read_catalog``), read from ``path``."""
    if length_from is not None:
        want = length_spec(length_from, frames_per_second).describe()
        if c["meta"]["length_from"] != want:
            raise ValueError(scrub(f"catalog {path} holds lengths from {c['meta']['length_from']!r}, not {want!r}; "
                                   "re-index with the same --length-from/--frames-per-second or drop length_from"))
    starts = np.concatenate([[0], np.cumsum(c["counts"])]).astype(np.int64)
    return Catalog(tuple(c["urls"]), tuple(c["sidecars"]), c["counts"].astype(np.int64), tuple(c["digests"]),
                   c["lengths"], starts, c["sizes"], tuple(c["etags"]), storage_options)


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
    stale = any(w.startswith("stale") for _, w in bad)
    cmd, note = index_command(target, force=stale, index_dir=index_dir, spec=spec, probe=urls[i])
    msg = (f"{len(bad)} of {len(urls)} shards have no usable sidecar index (first: {urls[i]}: {why}); "
           f"run `{cmd}` (or streambatch.index_shards(...)) first")
    if note:
        msg += f" ({note})"
    remote = [j for j, _ in bad if not is_local(urls[j])]
    if remote:
        msg += f"; {len(remote)} of them are not local files and must be indexed ahead of time"
    elif not index_missing:
        msg += ", or pass index_missing=True to index local shards on the fly"
    return msg


def _check_shards_exist(urls: list[str], pattern: str | None = None) -> None:
    """A local shard that is not there is "no such file", not a sidecar problem (``pattern``: the brace pattern
    the URLs came from, when one did: an unpadded range is named as the mistake it is)."""
    gone = [u for u in urls if is_local(u) and not os.path.isfile(local_path(u))]
    for u in gone:
        if os.path.exists(local_path(u)) and not os.path.isdir(local_path(u)):
            check_regular(u, os.stat(local_path(u)).st_mode)  # a FIFO, device or socket: say what it is
    if gone:
        what = "a directory, not a tar shard" if os.path.isdir(local_path(gone[0])) else "no such file"
        fixed = padding_fix(pattern) if isinstance(pattern, str) else None
        why = (f"the files there are numbered with zero padding ({os.path.basename(expand_urls(fixed)[0])}): "
               f"write the pattern as {fixed!r} (a brace range keeps the digits it is written with)" if fixed else
               "check the path or the pattern: 'train-{000000..000099}.tar' names 100 shards")
        raise FileNotFoundError(errno.ENOENT, scrub(
            f"{what} ({len(gone)} of {len(urls)} shards are missing, this is the first; {why})"),
            scrub(local_path(gone[0])))
