"""The sidecar format: one small file per shard listing its samples.

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
import os
import tempfile
from typing import Any

import numpy as np

from .lengths import LengthSpec
from .reader import is_local, local_path, url_basename
from .remote import is_remote
from .errors import ShardError

SIDECAR_SUFFIX = ".idx.npz"
FORMAT = "streambatch-index"
VERSION = 1
_PROBE = 64 * 1024


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


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for name in ("keys", "lengths", "offsets", "sizes"):
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def sidecar_path(url: str, index_dir: str | None = None) -> str:
    """Where the sidecar of ``url`` lives: next to the shard (a local file or
    an fsspec URL), or in ``index_dir`` (local or remote) under the shard's
    file name (required for ``pipe:`` shards)."""
    if index_dir is not None:
        index_dir = os.fspath(index_dir)
        if is_remote(index_dir):
            return index_dir.rstrip("/") + "/" + url_basename(url) + SIDECAR_SUFFIX
        return os.path.join(index_dir, url_basename(url) + SIDECAR_SUFFIX)
    if is_remote(url):
        return url.split("?", 1)[0] + SIDECAR_SUFFIX
    if not is_local(url):
        raise ValueError(
            f"shard {url!r} is not a local file, so its sidecar cannot sit next to it; pass index_dir= "
            "(a local directory for the sidecars) when indexing and when streaming"
        )
    return local_path(url) + SIDECAR_SUFFIX


def shard_stat(url: str, storage_options: dict | None = None) -> dict[str, Any]:
    """Identity of a shard: size, mtime, fingerprint (local files); size and
    ETag (fsspec URLs, one metadata request); {} for pipes."""
    if is_remote(url):
        from .remote_index import remote_stat

        return remote_stat(url, storage_options)
    if not is_local(url):
        return {}
    path = local_path(url)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ShardError(f"cannot open shard {url}: {exc}") from None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "fingerprint": shard_fingerprint(path, st.st_size)}


def write_sidecar(path: str, url: str, arrays: dict[str, np.ndarray], spec: LengthSpec, stat: dict,
                  storage_options: dict | None = None) -> dict:
    """Write a sidecar atomically (temp file + rename, or one object PUT), so
    concurrent indexers of the same shard never leave a torn file. Returns its meta."""
    meta = {"format": FORMAT, "version": VERSION, "url": url, "samples": int(arrays["lengths"].size),
            "length_from": spec.describe(), "digest": _digest(arrays), **stat}
    if is_remote(path):
        from .remote_index import npz_bytes, write_bytes

        write_bytes(path, npz_bytes(meta, arrays), storage_options)
        return meta
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


def read_meta(path: str, storage_options: dict | None = None) -> dict:
    from .remote_index import load_npz

    with load_npz(path, storage_options) as z:
        meta = json.loads(z["meta"].tobytes().decode())
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{path} is not a streambatch sidecar of version {VERSION}; re-index with `streambatch index --force`")
    return meta


def read_arrays(path: str, names: tuple[str, ...], storage_options: dict | None = None) -> tuple[np.ndarray, ...]:
    from .remote_index import load_npz

    with load_npz(path, storage_options) as z:
        return tuple(z[n] for n in names)


def staleness(url: str, meta: dict, stat: dict | None = None) -> str | None:
    """Why the sidecar no longer describes the shard, or None if it is current.

    Size must match; a changed mtime is forgiven when the head/tail
    fingerprint matches (a copy). Remote objects are checked against
    ``stat`` (their current size and ETag) when it is given. Pipes cannot be
    checked here: a mismatch shows up when a sample's key differs.
    """
    if is_remote(url) and stat:
        if stat.get("size") != meta.get("size"):
            return f"the shard has {stat.get('size')} bytes, the sidecar was written for {meta.get('size')}"
        if stat.get("etag") and meta.get("etag") and stat["etag"] != meta["etag"]:
            return f"the shard's ETag is {stat['etag']}, the sidecar was written for {meta['etag']}"
        return None
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
