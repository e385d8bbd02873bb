"""The sidecar format: one small file per shard listing its samples.

A sidecar ``<shard>.idx.npz`` (next to a local shard, or in ``index_dir``)
holds, for the N samples of the shard in tar order:

- ``keys``: (N,) bytes, the UTF-8 sample keys (webdataset's grouping);
- ``lengths``: (N,) int64, the planning length of each sample;
- ``offsets``: (N,) int64, byte offset of the sample's first tar header;
- ``sizes``: (N,) int64, bytes from there to the end of its last member;
- ``meta``: UTF-8 JSON: format version, how lengths were computed, a digest
  of the four arrays, and the shard's identity: ``size``, ``mtime_ns`` and
  ``fingerprint`` (blake2b of size + first and last 64 KiB) for local files,
  and ``content``, a SHA-256 digest of every byte of the shard.

Sidecars are written to a temporary file and renamed into place, never
rewritten in place. They are validated when read: the npz member headers
(dtype, shape) are checked before any array is allocated, and lengths,
offsets and sizes must be integers in range, in order, inside the shard;
any violation is a ``ShardError`` naming the sidecar (and the sample).
The sidecars of remote shards may live in object storage too (read in one
GET, written in one PUT).

What a current sidecar guarantees about its shard (staleness, the shard
identity recorded in ``meta``) is ``shard_identity.py``'s.

Stream: one shard's sample table (keys, lengths, offsets, sizes), checked.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ...core.redact import scrub
from ...core.units import MAX_LENGTH
from ..errors import ShardError
from ..io.objects import is_remote, protocol
from ..io.ranged import npz_bytes, read_npz_bytes, write_bytes
from ..io.urls import is_local, local_path, url_basename
from .hints import described_flags, index_command, quote

# re-exported: the shard identity checks lived here before shard_identity.py
from .identity import VERIFY_MODES as VERIFY_MODES
from .identity import content_digest as content_digest
from .identity import shard_stat as shard_stat
from .identity import staleness as staleness
from .lengths import LengthSpec

SIDECAR_SUFFIX = ".idx.npz"
FORMAT = "streambatch-index"
VERSION = 1
ARRAYS = ("keys", "lengths", "offsets", "sizes")
_MAX_META = 1 << 20  # bytes of meta JSON
_MAX_KEY = 1 << 16  # bytes per sample key
_BLOCK = 512  # a sample spans at least one tar header block


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for name in ARRAYS:
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


# Stores that take no uploads from a reader (plain HTTP servers, the Hugging Face Hub): their sidecars and
# catalog default to a local directory (default_index_dir) instead of a write next to the shards.
READ_ONLY_SCHEMES = frozenset(("http", "https", "hf"))


def index_home() -> str:
    """Where indexes of read-only shards go by default: ``$STREAMBATCH_INDEX_DIR``,
    else ``$XDG_CACHE_HOME/streambatch/index`` (``~/.cache/streambatch/index``)."""
    home = os.environ.get("STREAMBATCH_INDEX_DIR")
    if home:
        return home
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "streambatch", "index")


def default_index_dir(url: str) -> str | None:
    """The local directory that holds the index of a shard on a read-only store
    (``READ_ONLY_SCHEMES``): ``index_home()/<16 hex digits of the shard's
    directory URL>``, one per remote directory; None for every other shard
    (its sidecar sits next to it)."""
    if protocol(url) not in READ_ONLY_SCHEMES:
        return None
    u = urlsplit(url)  # no user, password, query or fragment: the same directory whoever asks, and no secret
    host = (u.hostname or "") + (f":{u.port}" if u.port else "")
    parent = f"{u.scheme.lower()}://{host}{u.path}".rsplit("/", 1)[0]
    return os.path.join(index_home(), hashlib.sha256(parent.encode()).hexdigest()[:16])


def sidecar_path(url: str, index_dir: str | None = None, *, for_write: bool = False) -> str:
    """Where the sidecar of ``url`` lives: in ``index_dir`` (local or remote)
    under the shard's file name (required for ``pipe:`` shards), else next to
    the shard (a local file or an fsspec URL). For a shard on a read-only store
    (HTTP, the Hub) the default is ``default_index_dir(url)``: always when
    writing (``for_write``), and when reading if a sidecar is there (else the
    one next to the shard, which a server may publish with its shards)."""
    if index_dir is not None:
        index_dir = os.fspath(index_dir)
        if is_remote(index_dir):
            return index_dir.rstrip("/") + "/" + url_basename(url) + SIDECAR_SUFFIX
        return os.path.join(index_dir, url_basename(url) + SIDECAR_SUFFIX)
    home = default_index_dir(url)
    if home is not None:
        local = os.path.join(home, url_basename(url) + SIDECAR_SUFFIX)
        if for_write or os.path.exists(local):
            return local
    if is_remote(url):
        return url.split("?", 1)[0] + SIDECAR_SUFFIX
    if not is_local(url):
        raise ValueError(
            f"shard {scrub(url)!r} is not a local file, so its sidecar cannot sit next to it; pass index_dir= "
            "(a local directory for the sidecars) when indexing and when streaming"
        )
    return local_path(url) + SIDECAR_SUFFIX


def write_sidecar(path: str, url: str, arrays: dict[str, np.ndarray], spec: LengthSpec, stat: dict,
                  storage_options: dict | None = None, retry=None) -> dict:
    """Write a sidecar atomically (temp file + rename, or one object PUT), so
    concurrent indexers of the same shard never leave a torn file. Returns its meta."""
    meta = {"format": FORMAT, "version": VERSION, "url": url, "samples": int(arrays["lengths"].size),
            "length_from": spec.describe(), "digest": _digest(arrays), **stat}
    if is_remote(path):
        write_bytes(path, npz_bytes(meta, arrays), storage_options, retry)
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


# ---------------------------------------------------------------- reading, validated


def _bad(path: str, what: str, url: str | None = None, length_from: str | None = None) -> ShardError:
    """A broken sidecar, with the command that rewrites it: the shard's URL and, when the sidecar's meta
    was readable, the length source it recorded (so the new sidecar holds the same lengths)."""

    beside = path[: -len(SIDECAR_SUFFIX)] if path.endswith(SIDECAR_SUFFIX) else None
    if not url and beside and not is_remote(path) and os.path.isfile(beside):  # meta unreadable: the shard beside it
        cmd, _ = index_command(beside, force=True, probe=beside)
        return ShardError(f"sidecar {path}: {what}; re-index the shard with `{cmd}`")
    if url:
        # a sidecar kept away from its shard (index_dir): the command writes the new one there too
        away = not is_remote(path) and os.path.abspath(path) != os.path.abspath(f"{url}{SIDECAR_SUFFIX}")
        in_dir = f" --index-dir {quote(os.path.dirname(path) or '.')}" if away else ""
        fix = f"`streambatch index --force{in_dir}{described_flags(length_from)} {quote(url)}`"
    else:
        fix = "`streambatch index --force` and the shard's path"
    return ShardError(f"sidecar {path}: {what}; re-index the shard with {fix}")


class SidecarFile:
    """An open sidecar: one file handle, so every member read comes from the
    same file even if the sidecar is replaced meanwhile. Use as a context
    manager; ``meta`` is read and validated on open."""

    def __init__(self, path: str, storage_options: dict | None = None, retry=None):
        self.path = path
        if is_remote(path):  # one GET (under ``retry``, a RetryPolicy); the sidecar is small
            self._fh = io.BytesIO(read_npz_bytes(path, storage_options, retry))
        else:
            self._fh = open(path, "rb")  # noqa: SIM115 (closed by close()); OSError passes through as is
        try:
            try:
                self._zip = zipfile.ZipFile(self._fh)
            except (zipfile.BadZipFile, ValueError, OSError) as exc:
                raise _bad(path, f"not an npz file ({exc})") from None
            raw = self._array("meta", "u", None, _MAX_META)
            try:
                meta = json.loads(raw.tobytes().decode("utf-8"))
            except (ValueError, RecursionError) as exc:
                raise _bad(path, f"its meta is not JSON ({type(exc).__name__})") from None
            self.meta = _check_meta(meta, path)
            self.url = self.meta["url"]
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> SidecarFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._fh.close()

    def _where(self) -> tuple[str | None, str | None]:
        """(shard URL, recorded length source) once the meta is read, for ``_bad``'s command."""
        meta = getattr(self, "meta", None) or {}
        return getattr(self, "url", None), meta.get("length_from")

    def _open(self, name: str, kinds: str, n: int | None, max_items: int | None = None):
        """Member ``name`` opened, with its npy header checked (dtype kind in
        ``kinds``, shape (n,)): (file positioned at the data, bytes of data)."""
        try:
            f = self._zip.open(name + ".npy")
        except KeyError:
            raise _bad(self.path, f"it has no {name!r} array", *self._where()) from None
        except (zipfile.BadZipFile, ValueError, OSError, NotImplementedError) as exc:
            raise _bad(self.path, f"cannot open its {name!r} member ({_one_line(exc)})", *self._where()) from None
        try:
            try:
                version = np.lib.format.read_magic(f)
                if version not in ((1, 0), (2, 0)):
                    raise ValueError(f"npy format version {version}")
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise _bad(self.path, f"its {name!r} member is not a numpy array ({_one_line(exc)})",
                           *self._where()) from None
            if dtype.hasobject or dtype.kind not in kinds or (kinds == "S" and dtype.itemsize > _MAX_KEY):
                want = {"S": "bytes", "u": "unsigned integers"}.get(kinds, "integers")
                raise _bad(self.path, f"its {name!r} array has dtype {dtype}, expected {want}", *self._where())
            if len(shape) != 1 or (n is not None and shape[0] != n) or (max_items is not None and shape[0] > max_items):
                expect = f"({n},) (the meta's sample count)" if n is not None else f"at most {max_items} items"
                raise _bad(self.path, f"its {name!r} array has shape {shape}, expected {expect}", *self._where())
        except BaseException:
            f.close()
            raise
        return f, shape[0] * dtype.itemsize, dtype

    def _array(self, name: str, kinds: str, n: int | None, max_items: int | None = None) -> np.ndarray:
        """Member ``name`` as a 1-D array, its header checked before any data is read."""
        f, nbytes, dtype = self._open(name, kinds, n, max_items)
        with f:
            try:
                data = f.read(nbytes)  # zip reads grow with the data present, not with the header's claim
            except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
                raise _bad(self.path, f"its {name!r} member is damaged ({_one_line(exc)})", *self._where()) from None
        if len(data) != nbytes:
            raise _bad(self.path, f"its {name!r} array is truncated ({len(data)} of {nbytes} bytes)", *self._where())
        return np.frombuffer(data, dtype=dtype).copy()

    def lengths(self) -> np.ndarray:
        """(N,) int64 lengths, each in [0, 2**62)."""
        lengths = self._array("lengths", "iu", self.meta["samples"])
        bad = np.flatnonzero((lengths < 0) | (lengths >= MAX_LENGTH))
        if bad.size:
            i = int(bad[0])
            raise _bad(self.path, f"sample {self._key(i)} of shard {self.url} has length {lengths[i]}; lengths "
                                  "must be integers in [0, 2**62)", *self._where())
        return lengths.astype(np.int64, copy=False)

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """keys (N,) bytes, offsets (N,) int64, sizes (N,) int64: samples in
        tar order, each after the previous one."""
        n = self.meta["samples"]
        keys = self._array("keys", "S", n)
        offsets = self._array("offsets", "iu", n)
        sizes = self._array("sizes", "iu", n)
        for name, arr, lo in (("offset", offsets, 0), ("size", sizes, _BLOCK)):
            bad = np.flatnonzero((arr < lo) | (arr > MAX_LENGTH))
            if bad.size:
                i = int(bad[0])
                raise _bad(self.path, f"sample {_show_key(keys[i])} of shard {self.url} has {name} {arr[i]} bytes "
                                      f"(expected >= {lo})", *self._where())
        offsets, sizes = offsets.astype(np.int64, copy=False), sizes.astype(np.int64, copy=False)
        ends = offsets + sizes
        bad = np.flatnonzero(offsets[1:] < ends[:-1])
        if bad.size:
            i = int(bad[0])
            raise _bad(self.path, f"sample {_show_key(keys[i])} of shard {self.url} at byte {offsets[i]} spans "
                                  f"{sizes[i]} bytes, past the next sample {_show_key(keys[i + 1])} at byte "
                                  f"{offsets[i + 1]}", *self._where())
        # A last sample past the end of the file is left to the reader: it
        # checks each sample against the file before reading, so only that
        # sample fails (or is skipped), as for a shard truncated after indexing.
        return keys, offsets, sizes

    def header_check(self) -> None:
        """Dtypes and shapes of every array, from the npz member headers only."""
        for name in ARRAYS:
            self._open(name, "S" if name == "keys" else "iu", self.meta["samples"])[0].close()

    def _key(self, i: int) -> str:
        try:
            return _show_key(self._array("keys", "S", self.meta["samples"])[i])
        except ShardError:
            return f"#{i}"


def _show_key(key: bytes) -> str:
    return repr(key.decode("utf-8", "surrogateescape"))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _check_meta(meta: Any, path: str) -> dict:
    if not isinstance(meta, dict):
        raise _bad(path, f"its meta is a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise _bad(path, f"not a streambatch sidecar of version {VERSION}")
    url = meta.get("url") if isinstance(meta.get("url"), str) else None
    for key, kind in (("url", str), ("samples", int), ("digest", str), ("length_from", str)):
        v = meta.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise _bad(path, f"its meta field {key!r} is {'missing' if v is None else repr(v)[:40]}, expected a "
                             f"{kind.__name__}", url)
    for key, kind in (("size", int), ("mtime_ns", int), ("fingerprint", str), ("content", str)):
        v = meta.get(key)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool) or (kind is int and v < 0)):
            raise _bad(path, f"its meta field {key!r} is {repr(v)[:40]}", url)
    samples, size = meta["samples"], meta.get("size")
    if samples < 0 or (size is not None and samples * _BLOCK > size):
        raise _bad(path, f"its meta says {samples} samples"
                         + (f" in a {size}-byte shard" if size is not None else ""), url)
    return meta


def read_meta(path: str, storage_options: dict | None = None) -> dict:
    """The validated meta of a sidecar."""
    with SidecarFile(path, storage_options) as sc:
        return sc.meta


def read_arrays(path: str, names: tuple[str, ...], storage_options: dict | None = None) -> tuple[np.ndarray, ...]:
    """Validated arrays of one sidecar (any of ``ARRAYS``), read from one open file."""
    with SidecarFile(path, storage_options) as sc:
        out: dict[str, np.ndarray] = {}
        if "lengths" in names:
            out["lengths"] = sc.lengths()
        if {"keys", "offsets", "sizes"} & set(names):
            out["keys"], out["offsets"], out["sizes"] = sc.table()
        return tuple(out[n] for n in names)

