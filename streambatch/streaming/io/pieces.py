"""The piece store: whole remote shards, or byte ranges of them ("pieces"),
as files of one cache directory that a rank's processes share.

The first process to need a piece downloads it whole (one GET, see
``remote.py``) under an exclusive ``flock`` of ``<dir>/<key>.lock`` into
``<dir>/<key>.data`` (temp file + atomic rename); the others wait on the
lock and then read the finished file by offset (``os.pread``). So each piece
crosses the network once per rank whatever ``num_workers`` is.

A process holds a shared ``flock`` on every file it downloaded or opened
until it releases it (``holds``), and ``discard`` deletes only files nobody
holds, so a live worker's files stay. A file is deleted when every worker
that reads it in a window is done with it (``release``: each adds one to the
length of the sparse file ``<key>.<epoch>.<window>.done``; the one that
completes the count deletes). A file deleted while open stays readable
(POSIX), so deletion can never corrupt a read: the worst a race can cost is
a second download. A failed download leaves ``<key>.err`` (so a waiting
process does not retry it all over again) and what did arrive as
``<key>.partial`` (readable up to where it ends).

Stream: pieces of remote shards as local files, held by descriptor."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import CacheError, ShardError
from .disk import SLACK, SPACE_ERRNOS, DiskSpace
from .objects import IOStats
from .remote import RemoteShard
from .retry import RetryPolicy

DEFERRED = "deferred"  # a prefetch that found no room: the reader downloads it when it needs it


@dataclass(frozen=True)
class ShardRef:
    """A remote shard (or the byte range [start, end) of one: a piece) and
    what the index recorded about it (size of the whole object, ETag; None:
    unknown)."""

    url: str
    size: int | None = None
    etag: str | None = None
    start: int = 0
    end: int | None = None

    @property
    def nbytes(self) -> int:
        return (self.end if self.end is not None else (self.size or 0)) - self.start


class PieceStore:
    """The pieces of one cache directory, as seen by one process.

    lock: shared with the prefetch queue (one lock guards the holds and the
    queue, which ``release`` updates together). make_room(want, must): set by
    the cache; frees room for a download that does not fit (returns the bytes
    free); by default it only looks.
    """

    def __init__(self, directory: str, storage_options: dict | None, retry: RetryPolicy, stats: IOStats,
                 space: DiskSpace, lock: threading.RLock):
        self.directory = directory
        self.storage_options = storage_options
        self.retry = retry
        self.stats = stats
        self.space = space
        self.closed = False  # a download under way stops at its next write
        self.make_room: Callable[[float, int], int | None] = lambda want, must: space.free()
        self._lock = lock
        self.holds: dict[ShardRef, int] = {}  # file -> descriptor with a shared flock on it: "in use here"

    def key(self, ref: ShardRef) -> str:
        whole = ref.start == 0 and (ref.end is None or ref.end == ref.size)
        name = ref.url if whole else f"{ref.url}#{ref.start}-{ref.end}"
        digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
        base = os.path.basename(ref.url.split("?", 1)[0].rstrip("/"))[-48:] or "shard"
        return f"{digest}-{base}" if whole else f"{digest}-{base}-{ref.start}"

    def path(self, ref: ShardRef) -> str:
        return os.path.join(self.directory, self.key(ref) + ".data")

    def base(self, ref: ShardRef) -> str:
        """The piece's files without their suffix."""
        return os.path.join(self.directory, self.key(ref))

    def fetch(self, ref: ShardRef, block: bool = True, *, hold: bool = True, background: bool = False) -> str | None:
        """Make sure the whole piece is in the cache and return its path; with
        ``hold``, keep a descriptor with a shared lock on it (``open``) until
        ``release``, so that no other process's ``discard`` deletes it.

        With ``block=False`` return None at once if another process is
        downloading it; with ``background``, ``DEFERRED`` if the disk has no
        room to prefetch it. Raises ShardError when the download fails (or
        failed in the process we waited for), CacheError when the disk cannot
        take it.
        """
        path = self.path(ref)
        with self._lock:
            if ref in self.holds:
                return path
        if self._keep(ref, path, hold):
            return path
        base = self.base(ref)
        waited_from = time.time()
        with self.space.guard("create a lock file", ref.url, max(ref.nbytes, 0)):
            os.makedirs(self.directory, exist_ok=True)
            fd = os.open(base + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    return None
                raise
            if self._keep(ref, path, hold):
                return path  # another process finished it while we waited
            err = recent_error(base + ".err", waited_from)
            if err is not None:  # the process we waited for gave up: do not retry all over again
                raise with_partial(ShardError(err), base)
            return self._download(ref, path, base, hold, background)
        finally:
            os.close(fd)  # releases the lock

    def _keep(self, ref: ShardRef, path: str, hold: bool) -> bool:
        """True if the piece is there (held now, with ``hold``)."""
        if not hold:
            return os.path.exists(path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self.space.error(exc, "open a cached piece", ref.url, max(ref.nbytes, 0)) from None
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits out a discard deciding on it (then this reads the unlinked copy)
        self._hold(ref, fd)
        return True

    def _hold(self, ref: ShardRef, fd: int) -> None:
        with self._lock:
            if ref not in self.holds:
                self.holds[ref] = fd
                return
        os.close(fd)

    def _download(self, ref: ShardRef, path: str, base: str, hold: bool, background: bool) -> str:
        need = max(ref.nbytes, 0)  # 0: size unknown, so no check before (a full disk is still caught)
        if need:
            free = self.space.free()
            if background and free is not None and free < 2 * need + SLACK:
                return DEFERRED  # no room to prefetch it and still take the reader's next piece
            if not background and free is not None and free < need + SLACK:
                free = self.make_room(need + SLACK, need)
                if free is not None and free < need:
                    raise self.space.full(ref.url, need, free)
        for attempt in (0, 1):
            try:
                return self._write(ref, path, base, hold)
            except CacheError as exc:
                if exc.errno not in SPACE_ERRNOS:
                    raise
                if background:
                    return DEFERRED
                if attempt:
                    raise self.space.full(ref.url, need, self.space.free()) from None
                self.make_room(need + SLACK if need else float("inf"), need)
        raise AssertionError("unreachable")

    def _write(self, ref: ShardRef, path: str, base: str, hold: bool) -> str:
        shard = RemoteShard(ref.url, self.storage_options, size=ref.size, etag=ref.etag, retry=self.retry,
                            stats=self.stats)
        with self.space.guard("create a file", ref.url, max(ref.nbytes, 0)):
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".data")
        keep = False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # in use from the start: another process's discard leaves it
            out = DiskWriter(fd, self, ref)
            try:
                shard.download(out, ref.start, ref.end)
            except ShardError as exc:
                if out.error is not None:  # the disk failed, not the shard
                    raise out.error from None
                with contextlib.suppress(OSError):  # a full disk must not hide the download's own error
                    if os.fstat(fd).st_size:  # what did arrive stays readable: only the samples past it fail
                        os.replace(tmp, base + ".partial")
                    write_text(base + ".err", str(exc))
                raise with_partial(exc, base) from None
            with self.space.guard("finish a download", ref.url, max(ref.nbytes, 0)):
                os.replace(tmp, path)
            keep = hold
        finally:
            if keep:
                self._hold(ref, fd)
            else:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # (gone after the rename)
        with contextlib.suppress(OSError):
            os.unlink(base + ".err")
        return path

    def held(self, ref: ShardRef) -> int | None:
        """The descriptor this process holds on the piece, or None."""
        with self._lock:
            return self.holds.get(ref)

    def release(self, ref: ShardRef, tag: str, consumers: int) -> None:
        """This process is done with the piece for the window ``tag``; the last
        of its ``consumers`` deletes the files. The hold is closed by the caller."""
        base = self.base(ref)
        try:
            complete = count_done(f"{base}.{tag}.done", consumers)
        except OSError:  # no counter on this disk (read-only, gone): delete it unless another process holds it
            self.discard(ref, (tag,))
            return
        if complete:
            # The lock file goes too: a process that still waits on it would at
            # worst download the shard again, never read a torn file.
            unlink(base, (tag,))

    def discard(self, ref: ShardRef, tags: tuple[str, ...] = ()) -> bool:
        """Delete the piece's files (and its counters of ``tags``) unless
        another process holds the piece or is downloading it; False if it does."""
        with self._lock:
            fd = self.holds.pop(ref, None)
        if fd is not None:
            os.close(fd)
        return discard_base(self.base(ref), tags)

    def sweep(self, want: float) -> int | None:
        """Delete pieces of the cache directory that no process holds until
        ``want`` bytes are free; returns the bytes free."""
        free = self.space.free()
        with contextlib.suppress(OSError):
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".data") and not n.startswith("."))
            for name in names:
                if free is None or free >= want:
                    break
                if discard_base(os.path.join(self.directory, name[: -len(".data")]), ()):
                    free = self.space.free()
        return free


def discard_base(base: str, tags: tuple[str, ...]) -> bool:
    """Delete the files of the piece at ``base`` (and its counters of
    ``tags``) unless a process holds it or is downloading it; False if one does."""
    for name in (base + ".data", base + ".lock"):  # in use: held, or (no file yet) being downloaded
        try:
            fd = os.open(name, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        finally:
            os.close(fd)
        break
    unlink(base, tags)
    return True


class DiskWriter:
    """The file ``RemoteShard.download`` writes to: whole writes, a local
    write error kept as CacheError (the download's retry loop reports any
    failure as a ShardError, which would make a full disk a broken shard),
    and a stop once the cache is closed."""

    def __init__(self, fd: int, store: PieceStore, ref: ShardRef):
        self.fd, self.store, self.ref = fd, store, ref
        self.error: CacheError | None = None

    def write(self, data: bytes) -> int:
        if self.store.closed:
            self.error = CacheError(errno.ECANCELED, f"the shard cache {self.store.directory} was closed")
            raise self.error
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as exc:
                self.error = self.store.space.error(exc, "write a download", self.ref.url, max(self.ref.nbytes, 0))
                raise self.error from None
            view = view[n:]
        return len(data)


def count_done(path: str, consumers: int) -> bool:
    """Count one more consumer done in the counter file ``path``; True when
    ``consumers`` are. The count is the file's length, grown with ftruncate:
    a sparse file, so it takes no disk block (and works on a full disk)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        n = os.fstat(fd).st_size + 1
        os.ftruncate(fd, n)
        return n >= consumers
    finally:
        os.close(fd)


def unlink(base: str, tags: tuple[str, ...] = ()) -> None:
    for suffix in (".data", ".err", ".lock", ".partial", *(f".{t}.done" for t in tags)):
        with contextlib.suppress(OSError):
            os.unlink(base + suffix)


def with_partial(exc: ShardError, base: str) -> ShardError:
    """Attach (path, bytes) of the part of a failed download that did arrive, if any."""
    try:
        exc.partial = (base + ".partial", os.path.getsize(base + ".partial"))
    except OSError:
        exc.partial = None
    return exc


def write_text(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def recent_error(path: str, since: float) -> str | None:
    try:
        if os.stat(path).st_mtime >= since - 1.0:
            with open(path) as f:
                return f.read()
    except OSError:
        pass
    return None
