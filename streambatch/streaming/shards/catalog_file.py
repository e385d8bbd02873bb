"""One catalog file per dataset: every shard's URL, sample count, size and
ETag, sidecar location and digest, and all planning lengths, in one ``.npz``
that a process reads in one request.

Opening 100,000 sidecars in every rank and worker would be 100,000 requests
per process; the catalog makes construction one read, and planning reads
lengths from it (no sidecar is opened until a shard's samples are read, and
then only by the rank that reads it). Parts (``part-I-of-N``) are written by
indexers running on several machines and merged into the catalog.

Arrays (S shards, N samples):
- ``urls``, ``sidecars``, ``etags``, ``digests``: newline-joined UTF-8 text;
- ``counts`` (S,) int64, ``sizes`` (S,) int64 (-1: unknown, e.g. ``pipe:``);
- ``lengths`` (N,) int32 or int64, shard after shard in ``urls`` order;
- ``meta``: JSON (format, version, length_from, shards, samples).

Version 2 stores relative local paths relative to the catalog's directory;
entries are resolved and checked on reading (``streaming/shards/catalog_trust.py``: a
catalog's entries are data, never commands). Version 1 files still load.

Stream: a ``*.catalog.npz`` file's shard list, counts and lengths."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, TypeGuard

import numpy as np

from ...core.redact import scrub
from ..io.objects import is_remote
from ..io.ranged import load_npz, npz_bytes, write_bytes
from ..io.retry import RetryPolicy
from .catalog_trust import relative_entries, resolve_entries
from .sidecar import default_index_dir

CATALOG_SUFFIX = ".catalog.npz"
FORMAT = "streambatch-catalog"
VERSION = 2
READABLE = (1, 2)


def is_catalog(urls: Any) -> TypeGuard[str | os.PathLike]:
    """Is ``urls`` the path or URL of a catalog file (``*.catalog.npz``)?"""
    return isinstance(urls, (str, os.PathLike)) and os.fspath(urls).endswith(CATALOG_SUFFIX)


def default_catalog_path(urls: list[str], index_dir: str | None) -> str:
    """``<index_dir or the first shard's directory>/streambatch.catalog.npz``;
    for shards on a read-only store (HTTP, the Hub) the default directory is
    local: ``sidecar.default_index_dir``."""
    if index_dir is None:
        index_dir = default_index_dir(urls[0])
    base = os.fspath(index_dir) if index_dir is not None else urls[0].split("?", 1)[0].rsplit("/", 1)[0]
    if base == urls[0].split("?", 1)[0] or base == "":  # a bare file name: the current directory
        base = "."
    if base.startswith("pipe:"):
        raise ValueError("pipe: shards need --index-dir (or --catalog) to say where the catalog goes")
    return _join(base, "streambatch" + CATALOG_SUFFIX)


def part_path(catalog: str, part: int, parts: int) -> str:
    return catalog[: -len(CATALOG_SUFFIX)] + f".part-{part:05d}-of-{parts:05d}.npz"


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name if is_remote(base) else os.path.join(base, name)


def _text(items) -> np.ndarray:
    return np.frombuffer("\n".join(items).encode("utf-8", "surrogateescape"), dtype=np.uint8)


def _untext(arr: np.ndarray, n: int) -> list[str]:
    if n == 0:
        return []
    out = arr.tobytes().decode("utf-8", "surrogateescape").split("\n")
    if len(out) != n:
        raise ValueError(f"corrupt catalog: {len(out)} entries where {n} were expected")
    return out


def check_entries(urls, what: str = "shard") -> None:
    """Refuse entries a catalog cannot hold: its text arrays are newline-joined, so a name with a line break
    would split into two entries and the catalog would not open."""
    for u in urls:
        if "\n" in u or "\r" in u:
            raise ValueError(scrub(f"{what} {u!r} has a line break in its name, which a catalog file cannot hold; "
                                   "rename the shard, or index without a catalog (--no-catalog; in Python "
                                   "catalog=False) and pass the shard list to StreamingBatches"))


def catalog_arrays(urls, sidecars, metas: list[dict], lengths: list[np.ndarray], length_from: str, *, at: str):
    """(meta, arrays) of the catalog (or part) to be written at ``at``, over
    shards in the given order (relative paths stored relative to ``at``)."""
    check_entries(urls)
    check_entries(sidecars, "sidecar")
    counts = np.array([len(x) for x in lengths], dtype=np.int64)
    every = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    if every.size and every.max() < 2**31:
        every = every.astype(np.int32)  # half the bytes to read on every process
    arrays = {
        "urls": _text(relative_entries(at, urls)), "sidecars": _text(relative_entries(at, sidecars)),
        "etags": _text([m.get("etag") or "" for m in metas]),
        "digests": _text([m["digest"] for m in metas]),
        "counts": counts,
        "sizes": np.array([m.get("size", -1) if m.get("size") is not None else -1 for m in metas], dtype=np.int64),
        "lengths": every,
    }
    meta = {"format": FORMAT, "version": VERSION, "length_from": length_from, "shards": len(urls),
            "samples": int(counts.sum())}
    return meta, arrays


def write_catalog(path: str, meta: dict, arrays: dict, storage_options: dict | None = None, *,
                  retry: RetryPolicy | None = None) -> None:
    """Write atomically: a local temp file + rename, or one object PUT (under ``retry``)."""
    data = npz_bytes(meta, arrays)
    if is_remote(path):
        write_bytes(path, data, storage_options, retry)
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=CATALOG_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_catalog(path: str, storage_options: dict | None = None, *,
                 trust: bool | frozenset[str] = False, retry: RetryPolicy | None = None) -> dict[str, Any]:
    """The catalog's contents: meta plus urls, sidecars, etags, digests
    (lists of str), counts, sizes (int64) and lengths (int32/int64) arrays.
    urls and sidecars come resolved and checked against ``trust``
    (``streaming/shards/catalog_trust.py``): an entry the catalog may not list is an
    ``UntrustedCatalogError`` before anything opens it. A remote catalog is
    one GET under ``retry`` (its timeout bounds each wait)."""
    try:
        z = load_npz(os.fspath(path), storage_options, retry)
    except FileNotFoundError:
        raise FileNotFoundError(scrub(f"no catalog at {path}; write one with "
                                      f"`streambatch index SHARDS --catalog {path}`")) from None
    with z:
        meta = json.loads(z["meta"].tobytes().decode())
        if meta.get("format") != FORMAT or meta.get("version") not in READABLE:
            raise ValueError(scrub(f"{path} is not a streambatch catalog of a version this streambatch reads "
                                   f"({list(READABLE)}); rebuild it with `streambatch index --force`"))
        s = int(meta["shards"])
        out = {"meta": meta, "counts": z["counts"], "sizes": z["sizes"], "lengths": z["lengths"]}
        for name in ("urls", "sidecars", "etags", "digests"):
            out[name] = _untext(z[name], s)
    if out["counts"].shape[0] != s or int(out["counts"].sum()) != out["lengths"].shape[0]:
        raise ValueError(scrub(f"corrupt catalog {path}: counts do not add up to the lengths it holds"))
    for name, what in (("urls", "shard"), ("sidecars", "sidecar")):
        out[name] = resolve_entries(os.fspath(path), out[name], version=meta["version"], trust=trust, what=what)
    return out


def merge_parts(path: str, parts: int, storage_options: dict | None = None, *,
                retry: RetryPolicy | None = None) -> dict[str, Any]:
    """Merge ``part-*-of-parts`` files into the catalog at ``path``; shards
    keep the order of the original list (parts interleave: shard k is in
    part k mod parts). Returns the catalog's meta."""
    loaded = [_read_part(part_path(path, i, parts), storage_options, retry) for i in range(parts)]
    total = sum(p["meta"]["shards"] for p in loaded)
    order = [(k % parts, k // parts) for k in range(total)]
    spec = {p["meta"]["length_from"] for p in loaded}
    if len(spec) != 1:
        raise ValueError(f"catalog parts were indexed with different length sources {sorted(spec)}; re-run "
                         "every part with the same --length-from/--frames-per-second")
    starts = [np.concatenate([[0], np.cumsum(p["counts"])]) for p in loaded]
    pick = lambda name: [loaded[i][name][j] for i, j in order]  # noqa: E731
    lengths = [loaded[i]["lengths"][starts[i][j]: starts[i][j + 1]] for i, j in order]
    metas = [{"etag": e or None, "digest": d, "size": int(z) if z >= 0 else None}
             for e, d, z in zip(pick("etags"), pick("digests"), pick("sizes"))]
    meta, arrays = catalog_arrays(pick("urls"), pick("sidecars"), metas, lengths, spec.pop(), at=path)
    write_catalog(path, meta, arrays, storage_options, retry=retry)
    return meta


def _read_part(path: str, storage_options: dict | None, retry: RetryPolicy | None = None) -> dict[str, Any]:
    try:
        return read_catalog(path, storage_options, trust=True, retry=retry)  # parts this job's own indexers wrote
    except FileNotFoundError:
        raise FileNotFoundError(scrub(f"catalog part {path} is missing: its indexing job has not finished (or "
                                      "failed); run it again, then merge")) from None
