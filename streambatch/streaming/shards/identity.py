"""A shard's identity, and whether its sidecar still describes it.

The sidecar's meta records the shard's identity when it was indexed
(``shard_stat``): ``size``, ``mtime_ns`` and ``fingerprint`` (blake2b of size
+ first and last 64 KiB) for local files, ``content`` (a SHA-256 digest of
every byte), and for remote (fsspec) shards their size and ETag.

Staleness, i.e. what a current sidecar guarantees (``staleness``):

- ``verify="stat"`` (default, cheap): the shard's size must equal the
  recorded one; if its mtime differs (a copy), the head/tail fingerprint must
  match too. This catches appends, truncations and rewrites that change the
  size, mtime or the first/last 64 KiB; it trusts a same-size edit that keeps
  the mtime (``cp -p``/``rsync -t`` of an edited file) or touches only the
  middle of a copied shard.
- ``verify="full"``: the whole shard is re-read and its content digest
  compared with the one recorded at index time: any change is caught, at the
  cost of reading every byte once per open.

``pipe:`` streams are checked only with ``verify="full"``; otherwise a
changed stream shows up as a key mismatch when a sample is read. Remote
(fsspec) shards are checked by size and ETag, against ``stat`` (their
current ones) when it is given.

Stream: a shard's identity (size, mtime or ETag, content digest)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ..errors import ShardError
from ..io.objects import is_remote
from ..io.ranged import remote_stat
from ..io.reader import check_regular, open_stream
from ..io.urls import is_local, local_path

VERIFY_MODES = ("stat", "full")
_PROBE = 64 * 1024
_CHUNK = 1 << 20


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


def content_hasher():
    """The hash of ``meta["content"]``: SHA-256 over every byte of the shard
    (OpenSSL's, with the CPU's SHA instructions where present: about twice
    blake2b's speed here)."""
    return hashlib.sha256()


class HashingStream:
    """Wraps a stream, hashing what is read through it (the indexer's scan of
    a non-seekable shard reads every byte, end-of-archive included)."""

    def __init__(self, f, h):
        self.f, self.h = f, h

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.f.close()


def content_digest(url: str) -> str:
    """The content digest of a whole shard (a local file or a stream)."""
    h = content_hasher()
    try:
        with open(local_path(url), "rb") if is_local(url) else open_stream(url) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except OSError as exc:
        raise ShardError(f"cannot read shard {url}: {exc}") from exc
    return h.hexdigest()


def shard_stat(url: str, storage_options: dict | None = None) -> dict[str, Any]:
    """Identity of a local shard (size, mtime, fingerprint, content digest:
    this reads the whole file once); of a remote (fsspec) shard, its size and
    ETag (one metadata request); {} for pipes, whose content digest the
    indexer takes while scanning."""
    if is_remote(url):
        return remote_stat(url, storage_options)
    if not is_local(url):
        return {}
    path = local_path(url)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ShardError(f"cannot open shard {url}: {exc}") from None
    check_regular(url, st.st_mode)  # before reading it whole: a FIFO would block, /dev/zero never end
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "fingerprint": shard_fingerprint(path, st.st_size),
            "content": content_digest(url)}

def staleness(url: str, meta: dict, stat: dict | None = None, verify: str = "stat") -> str | None:
    """Why the sidecar no longer describes the shard, or None if it is current
    (see the module docstring for what each ``verify`` mode guarantees)."""
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if is_remote(url):
        if stat:
            if stat.get("size") != meta.get("size"):
                return f"the shard has {stat.get('size')} bytes, the sidecar was written for {meta.get('size')}"
            if stat.get("etag") and meta.get("etag") and stat["etag"] != meta["etag"]:
                return f"the shard's ETag is {stat['etag']}, the sidecar was written for {meta['etag']}"
        return None
    if is_local(url):
        path = local_path(url)
        try:
            st = os.stat(path)
        except OSError as exc:
            return f"cannot stat the shard ({exc})"
        if st.st_size != meta.get("size"):
            return f"the shard has {st.st_size} bytes, the sidecar was written for {meta.get('size')}"
        if verify == "stat" and st.st_mtime_ns != meta.get("mtime_ns"):
            fp = (stat or {}).get("fingerprint") or shard_fingerprint(path, st.st_size)
            if fp != meta.get("fingerprint"):
                return "the shard's content changed since it was indexed"
    if verify == "full":
        if not meta.get("content"):
            return "the sidecar records no content digest (written by an older streambatch)"
        if content_digest(url) != meta["content"]:
            return "the shard's content changed since it was indexed (full content digest)"
    return None
