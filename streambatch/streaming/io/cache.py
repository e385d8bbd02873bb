"""A node-local cache of whole remote shards, shared by one rank's
DataLoader workers, with background prefetch.

Why whole shards on local disk: the plan does not depend on ``num_workers``
(worker w of N yields the rank's steps w, w + N, ...), so every worker of a
rank needs samples from the same shards. The first process to need a shard
downloads it whole (one GET, see ``remote.py``) under an exclusive
``flock`` into ``<dir>/<key>.tar`` (temp file + atomic rename); the others
wait on the lock and then read the finished file by offset (``os.pread``).
So each shard crosses the network once per rank per epoch whatever
``num_workers`` is, and once per job when ranks read disjoint shards
(the shard-affine plan).

Bounds: a shard file is deleted when every worker of the rank that reads
it in a window is done with it (each adds one to the length of the sparse
file ``<key>.<epoch>.<window>.done``, under its lock; the one that completes
the count deletes). Disk holds the rank's shards of the current window plus
the prefetched ones (``prefetch_shards`` / ``prefetch_bytes`` ahead, per
worker). A pass that stops early (a loop that breaks) releases what it held
when its reader closes: each process holds a shared ``flock`` on every file
it downloaded or opened until it releases it, and a closing process deletes
only the files nobody holds (``discard``), so a live worker's files stay.
Memory holds one ``READ_CHUNK`` (1 MiB) per download thread; samples are
read with ``pread``, so resident memory does not grow with the number of
shards. A file that is deleted while open stays readable (POSIX), so
deletion can never corrupt a read: the worst a race can cost is a second
download.

The disk is the machine's, not the sample's: a full disk (ENOSPC, EDQUOT),
one that is not writable (EACCES, EPERM, EROFS, ENOTDIR, EISDIR) or a
process out of descriptors or memory raises ``CacheError`` (an OSError, not
a ShardError: never retried, never skipped by ``on_error="skip"``). Prefetch
starts a download only while the disk has room for it and as much again
(``_roomy``); short of that it stops until the reader moves on, and the
reader downloads what it needs itself, first deleting this process's own
prefetched files it has not reached yet. Only a piece that still does not
fit is an error.

Stream: shard byte ranges on node-local disk, shared by the rank's processes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ...core.redact import logger, scrub_url
from ..errors import CacheError, ShardError
from .objects import IOStats
from .remote import RemoteShard
from .retry import RetryPolicy

log = logger("streambatch.streaming")
SLACK = 64 << 10  # bytes a download needs beyond its own: lock and counter files, partly filled blocks
SPACE_WAIT = 30.0  # seconds a reader short of disk space waits for the rank's other workers to free some
_SPACE = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT") if hasattr(errno, n))
_RESOURCES = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM))
_DEFERRED = "deferred"  # a prefetch that found no room: the reader downloads it when it needs it
_RUN_NAME = re.compile(r"^(?P<host>.+)-(?P<pid>\d+)-r(?P<rank>\d+)$")


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


def default_cache_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"streambatch-cache-{os.getuid() if hasattr(os, 'getuid') else 0}")


def run_dir(root: str | None, owner_pid: int, rank: int) -> str:
    """The cache directory of one rank of one run: ``<root>/<host>-<pid>-r<rank>``."""
    return os.path.join(root or default_cache_root(), f"{socket.gethostname()}-{owner_pid}-r{rank}")


def sweep_dead_runs(root: str | None) -> int:
    """Remove cache directories of runs on this host whose process is gone
    (a crashed job). Returns how many were removed."""
    root = root or default_cache_root()
    host = socket.gethostname()
    removed = 0
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    for name in names:
        m = _RUN_NAME.match(name)
        if m is None or m["host"] != host:
            continue
        try:
            os.kill(int(m["pid"]), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed += 1
        except OSError:  # alive but not ours (EPERM): leave it
            pass
    return removed


class ShardCache:
    """Whole-shard downloads into ``directory``, coordinated across processes
    by file locks, with a per-process prefetch queue.

    prefetch_shards / prefetch_bytes: at most this many shards (bytes, if
    sizes are known) downloaded or downloading ahead of the consumer, per
    process. threads: parallel background downloads per process. peers: the
    processes sharing ``directory`` (the rank's DataLoader workers); with
    more than one, a reader short of disk space waits up to ``SPACE_WAIT``
    seconds for the others to free some before it raises ``CacheError``.
    """

    def __init__(self, directory: str, storage_options: dict | None = None, *, retry: RetryPolicy | None = None,
                 prefetch_shards: int = 4, prefetch_bytes: int | None = None, threads: int = 2,
                 stats: IOStats | None = None, peers: int = 1):
        self.directory = directory
        self.storage_options = storage_options
        self.retry = retry or RetryPolicy()
        self.prefetch_shards = prefetch_shards
        self.prefetch_bytes = prefetch_bytes
        self.peers = peers
        self.stats = stats or IOStats()
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="streambatch-prefetch")
        # Re-entrant: a future that is already done runs its callback (which
        # takes this lock) inside _top_up, which holds it.
        self._lock = threading.RLock()
        # The prefetch queue (refs in need order), a cursor to the first one not yet considered, and the
        # refs submitted but not yet taken with their bytes as running counters: a call costs O(refs it
        # submits), not O(queue) (a window's pieces: thousands with tiny shards).
        self._queue: list[ShardRef] = []
        self._index: dict[ShardRef, int] = {}
        self._cursor = 0
        self._ahead: dict[ShardRef, int] = {}
        self._ahead_bytes = 0
        self._starved = False  # a prefetch found no room: start none until the reader takes or releases one
        self._futures: dict[ShardRef, Future] = {}
        self._taken: set[ShardRef] = set()
        self._failed: dict[ShardRef, ShardError] = {}
        self._holds: dict[ShardRef, int] = {}  # file -> descriptor with a shared flock on it: "in use here"
        self.sidecars: set[ShardRef] = set()  # sidecar copies this process read (released at the epoch's end)
        self._closed = False

    # ------------------------------------------------------------ paths

    def key(self, ref: ShardRef) -> str:
        whole = ref.start == 0 and (ref.end is None or ref.end == ref.size)
        name = ref.url if whole else f"{ref.url}#{ref.start}-{ref.end}"
        digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
        base = os.path.basename(ref.url.split("?", 1)[0].rstrip("/"))[-48:] or "shard"
        return f"{digest}-{base}" if whole else f"{digest}-{base}-{ref.start}"

    def path(self, ref: ShardRef) -> str:
        return os.path.join(self.directory, self.key(ref) + ".data")

    # ------------------------------------------------------------ fetching

    def fetch(self, ref: ShardRef, block: bool = True, *, hold: bool = True, background: bool = False) -> str | None:
        """Make sure the whole piece is in the cache and return its path; with
        ``hold``, keep a descriptor with a shared lock on it (``open``) until
        ``release``, so that no other process's ``discard`` deletes it.

        With ``block=False`` return None at once if another process is
        downloading it; with ``background``, ``_DEFERRED`` if the disk has no
        room to prefetch it. Raises ShardError when the download fails (or
        failed in the process we waited for), CacheError when the disk cannot
        take it.
        """
        path = self.path(ref)
        with self._lock:
            if ref in self._holds:
                return path
        if self._keep(ref, path, hold):
            return path
        base = os.path.join(self.directory, self.key(ref))
        waited_from = time.time()
        with self._disk("create a lock file", ref):
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
            err = _recent_error(base + ".err", waited_from)
            if err is not None:  # the process we waited for gave up: do not retry all over again
                raise _with_partial(ShardError(err), base)
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
            raise self._error(exc, "open a cached piece", ref) from None
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits out a discard deciding on it (then this reads the unlinked copy)
        self._hold(ref, fd)
        return True

    def _hold(self, ref: ShardRef, fd: int) -> None:
        with self._lock:
            if ref not in self._holds:
                self._holds[ref] = fd
                return
        os.close(fd)

    def _download(self, ref: ShardRef, path: str, base: str, hold: bool, background: bool) -> str:
        need = max(ref.nbytes, 0)  # 0: size unknown, so no check before (a full disk is still caught)
        if need:
            free = self._free()
            if background and free is not None and free < 2 * need + SLACK:
                return _DEFERRED  # no room to prefetch it and still take the reader's next piece
            if not background and free is not None and free < need + SLACK:
                free = self._make_room(need + SLACK, need)
                if free is not None and free < need:
                    raise self._full(ref, need, free)
        for attempt in (0, 1):
            try:
                return self._write(ref, path, base, hold)
            except CacheError as exc:
                if exc.errno not in _SPACE:
                    raise
                if background:
                    return _DEFERRED
                if attempt:
                    raise self._full(ref, need, self._free()) from None
                self._make_room(need + SLACK if need else float("inf"), need)
        raise AssertionError("unreachable")

    def _write(self, ref: ShardRef, path: str, base: str, hold: bool) -> str:
        shard = RemoteShard(ref.url, self.storage_options, size=ref.size, etag=ref.etag, retry=self.retry,
                            stats=self.stats)
        with self._disk("create a file", ref):
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".data")
        keep = False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # in use from the start: another process's discard leaves it
            out = _DiskWriter(fd, self, ref)
            try:
                shard.download(out, ref.start, ref.end)
            except ShardError as exc:
                if out.error is not None:  # the disk failed, not the shard
                    raise out.error from None
                with contextlib.suppress(OSError):  # a full disk must not hide the download's own error
                    if os.fstat(fd).st_size:  # what did arrive stays readable: only the samples past it fail
                        os.replace(tmp, base + ".partial")
                    _write_text(base + ".err", str(exc))
                raise _with_partial(exc, base) from None
            with self._disk("finish a download", ref):
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

    def open(self, ref: ShardRef) -> int:
        """A read-only descriptor of the piece (``get``), owned by the cache until ``release``."""
        self.get(ref)
        with self._lock:
            return self._holds[ref]

    # ------------------------------------------------------------ disk space and errors

    def _free(self) -> int | None:
        try:
            return shutil.disk_usage(self.directory).free
        except OSError:
            return None

    def _make_room(self, want: float, must: int) -> int | None:
        """Delete this process's prefetched pieces the reader has not reached,
        furthest first, until ``want`` bytes are free; then, with peers, wait
        for ``must``. Returns the bytes free."""
        free = self._free()
        with self._lock:
            end = len(self._queue)
            victims = sorted((r for r, f in self._futures.items() if r in self._ahead and f.done()),
                             key=lambda r: self._index.get(r, end), reverse=True)
        for r in victims:
            if free is None or free >= want:
                break
            with self._lock:
                self._unqueue(r)
            self.discard(r)
            free = self._free()
        if self.peers < 2 or free is None or free >= must or free + self._used() < must:
            return free  # no one else to wait for, or it would not fit even if they freed all they hold
        deadline = time.monotonic() + SPACE_WAIT
        while True:
            # Pieces no process holds: other workers' prefetches they have not reached, and pieces released
            # by some of their readers. A worker blocked by the DataLoader (its batches wait for this one's)
            # would never free its prefetches itself; deleting them costs at worst a second download.
            free = self._sweep(want) or 0
            if free >= must or time.monotonic() >= deadline:
                return free
            time.sleep(0.05)  # the rank's other workers release pieces as they move on

    def _sweep(self, want: float) -> int | None:
        """Delete pieces of the cache directory that no process holds until
        ``want`` bytes are free; returns the bytes free."""
        free = self._free()
        with contextlib.suppress(OSError):
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".data") and not n.startswith("."))
            for name in names:
                if free is None or free >= want:
                    break
                if _discard_base(os.path.join(self.directory, name[: -len(".data")]), ()):
                    free = self._free()
        return free

    def _used(self) -> int:
        """Bytes the cache directory's files take on disk (what the rank's workers could free)."""
        total = 0
        with contextlib.suppress(OSError), os.scandir(self.directory) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
        return total

    def _full(self, ref: ShardRef, need: int, free: int | None) -> CacheError:
        return CacheError(errno.ENOSPC, f"the shard cache {self.directory} is full: {free} bytes free, a piece "
                          f"of shard {scrub_url(ref.url)} needs {need or 'more'}; pass cache_dir= on a disk with "
                          "more room, or lower prefetch_shards= / prefetch_bytes= (downloads ahead, per DataLoader "
                          "worker) or window_samples= (the cache holds about two windows of this rank's shards)",
                          directory=self.directory)

    def _error(self, exc: OSError, doing: str, ref: ShardRef | None = None) -> CacheError:
        """The CacheError for an OSError of the cache's own files."""
        if exc.errno in _SPACE:
            return self._full(ref, max(ref.nbytes, 0), self._free()) if ref else CacheError(
                exc.errno, f"the shard cache {self.directory} is full ({doing}: {exc.strerror}); pass cache_dir= "
                "on a disk with more room", directory=self.directory)
        if exc.errno in _RESOURCES:
            return CacheError(exc.errno, f"the shard cache {self.directory} cannot {doing}: {exc.strerror}; raise "
                              "the open-file limit (ulimit -n) or lower num_workers= / prefetch_shards=",
                              directory=self.directory)
        return CacheError(exc.errno, f"the shard cache {self.directory} is not writable (cannot {doing}: "
                          f"{exc.strerror}); pass cache_dir= a writable directory on a local disk",
                          directory=self.directory)

    @contextlib.contextmanager
    def _disk(self, doing: str, ref: ShardRef | None = None):
        try:
            yield
        except CacheError:
            raise
        except OSError as exc:
            raise self._error(exc, doing, ref) from None

    # ------------------------------------------------------------ prefetch

    def schedule(self, refs: list[ShardRef]) -> None:
        """The shards this process will read next, in the order it needs
        them (the rest of this window, then the next). Replaces the previous
        queue and starts background downloads within the prefetch bound."""
        with self._lock:
            self._queue = [r for r in refs if r not in self._taken]
            self._index = {}
            for i, r in enumerate(self._queue):
                self._index.setdefault(r, i)
            self._cursor = 0
            self._top_up()

    def _top_up(self) -> None:
        # caller holds self._lock; the cursor only moves on, except to give back a deferred prefetch
        q = self._queue
        while (not self._closed and not self._starved and len(self._ahead) < self.prefetch_shards
               and self._cursor < len(q)):
            ref = q[self._cursor]
            if ref in self._futures or ref in self._taken:
                self._cursor += 1
                continue
            if self.prefetch_bytes is not None and self._ahead and self._ahead_bytes + ref.nbytes > self.prefetch_bytes:
                break
            self._cursor += 1
            fut = self._pool.submit(self._background, ref)
            self._futures[ref] = fut
            self._ahead[ref] = ref.nbytes
            self._ahead_bytes += ref.nbytes
            fut.add_done_callback(lambda f, r=ref: self._after(r, f))

    def _drop_ahead(self, ref: ShardRef) -> None:
        # caller holds self._lock
        n = self._ahead.pop(ref, None)
        if n is not None:
            self._ahead_bytes -= n

    def _unqueue(self, ref: ShardRef) -> None:
        """Forget a prefetch (deferred, or deleted to make room): it is
        prefetched again once there is room. Caller holds self._lock."""
        self._futures.pop(ref, None)
        self._drop_ahead(ref)
        i = self._index.get(ref)
        if i is not None and i < self._cursor:
            self._cursor = i
        self._starved = True

    def _after(self, ref: ShardRef, fut: Future) -> None:
        with self._lock:
            if not fut.cancelled() and fut.result() is _DEFERRED and self._futures.get(ref) is fut:
                self._unqueue(ref)
            self._top_up()

    def _background(self, ref: ShardRef) -> str | Exception | None:
        try:
            # not held: until the reader takes it, another worker short of disk space may delete it
            # (the reader then downloads it again), so prefetch can never wedge a rank's workers
            return self.fetch(ref, block=False, hold=False, background=True)
        except (ShardError, CacheError) as exc:
            return exc  # handed to the consumer by get()
        except OSError as exc:  # the cache's own files
            return self._error(exc, "prefetch", ref)
        except Exception as exc:  # never let a prefetch thread die silently
            return ShardError(f"prefetching shard {scrub_url(ref.url)} failed: {exc!r}")

    def get(self, ref: ShardRef) -> str:
        """Path of the whole shard in the cache (held), waiting for (or
        doing) its download; raises ShardError (again, for every sample of a
        failed shard) or CacheError."""
        if ref in self._failed:
            raise self._failed[ref]
        with self._lock:
            self._taken.add(ref)
            self._drop_ahead(ref)
            self._starved = False
            fut = self._futures.get(ref)
            self._top_up()
        result = fut.result() if fut is not None else None
        try:
            if isinstance(result, Exception):
                raise result
            with self._lock:
                held = ref in self._holds
            return self.path(ref) if held else self.fetch(ref)
        except ShardError as exc:
            self._failed[ref] = exc
            raise

    # ------------------------------------------------------------ releasing

    def release(self, ref: ShardRef, tag: str, consumers: int) -> None:
        """This process is done with ``ref`` for the window ``tag``; the last
        of its ``consumers`` deletes the file."""
        with self._lock:
            self._taken.discard(ref)
            self._futures.pop(ref, None)
            self._drop_ahead(ref)
            self._starved = False
            fd = self._holds.pop(ref, None)
        if fd is not None:
            os.close(fd)
        self._failed.pop(ref, None)
        base = os.path.join(self.directory, self.key(ref))
        try:
            complete = _count(f"{base}.{tag}.done", consumers)
        except OSError:  # no counter on this disk (read-only, gone): delete it unless another process holds it
            self.discard(ref, (tag,))
            return
        if complete:
            # The lock file goes too: a process that still waits on it would at
            # worst download the shard again, never read a torn file.
            _unlink(base, (tag,))

    def discard(self, ref: ShardRef, tags: tuple[str, ...] = ()) -> bool:
        """Delete the piece's files (and its counters of ``tags``) unless
        another process holds the piece or is downloading it; False if it does."""
        with self._lock:
            fd = self._holds.pop(ref, None)
        if fd is not None:
            os.close(fd)
        return _discard_base(os.path.join(self.directory, self.key(ref)), tags)

    def close(self, discard: list[tuple[ShardRef, tuple[str, ...]]] = ()) -> None:
        """Stop prefetching (a download under way stops at its next write)
        and delete what this process fetched and still holds, and the pieces
        ``discard`` names (with their counters' tags), except where another
        process holds them."""
        with self._lock:
            self._closed = True
            self._queue, self._index, self._cursor = [], {}, 0
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            todo = dict.fromkeys([*self._futures, *self._holds], ())
            self._futures.clear()
            self._ahead.clear()
            self._ahead_bytes = 0
            holds, self._holds = list(self._holds.values()), {}
        for fd in holds:  # first: a lock this process holds would keep its own discard out
            os.close(fd)
        for ref, tags in discard:
            todo[ref] = todo.get(ref, ()) + tuple(tags)
        for ref, tags in todo.items():
            self.discard(ref, tags)


def _discard_base(base: str, tags: tuple[str, ...]) -> bool:
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
    _unlink(base, tags)
    return True


class _DiskWriter:
    """The file ``RemoteShard.download`` writes to: whole writes, a local
    write error kept as CacheError (the download's retry loop reports any
    failure as a ShardError, which would make a full disk a broken shard),
    and a stop once the cache is closed."""

    def __init__(self, fd: int, cache: ShardCache, ref: ShardRef):
        self.fd, self.cache, self.ref = fd, cache, ref
        self.error: CacheError | None = None

    def write(self, data: bytes) -> int:
        if self.cache._closed:
            self.error = CacheError(errno.ECANCELED, f"the shard cache {self.cache.directory} was closed")
            raise self.error
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as exc:
                self.error = self.cache._error(exc, "write a download", self.ref)
                raise self.error from None
            view = view[n:]
        return len(data)


def _count(path: str, consumers: int) -> bool:
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


def _unlink(base: str, tags: tuple[str, ...] = ()) -> None:
    for suffix in (".data", ".err", ".lock", ".partial", *(f".{t}.done" for t in tags)):
        with contextlib.suppress(OSError):
            os.unlink(base + suffix)


def _with_partial(exc: ShardError, base: str) -> ShardError:
    """Attach (path, bytes) of the part of a failed download that did arrive, if any."""
    try:
        exc.partial = (base + ".partial", os.path.getsize(base + ".partial"))
    except OSError:
        exc.partial = None
    return exc


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _recent_error(path: str, since: float) -> str | None:
    try:
        if os.stat(path).st_mtime >= since - 1.0:
            with open(path) as f:
                return f.read()
    except OSError:
        pass
    return None
