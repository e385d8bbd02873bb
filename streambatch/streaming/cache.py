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
it in a window is done with it (each appends a byte to
``<key>.<epoch>.<window>.done``; the one that completes the count
deletes). Disk holds the rank's shards of the current window plus the
prefetched ones (``prefetch_shards`` / ``prefetch_bytes`` ahead, per
worker). Memory holds one ``READ_CHUNK`` (1 MiB) per download thread;
samples are read with ``pread``, so resident memory does not grow with the
number of shards. A file that is deleted while open stays readable (POSIX),
so deletion can never corrupt a read: the worst a race can cost is a
second download.
"""

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

from ..core.redact import logger
from .errors import ShardError
from .remote import IOStats, RemoteShard, RetryPolicy, scrub_url

log = logger("streambatch.streaming")
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
    process. threads: parallel background downloads per process.
    """

    def __init__(self, directory: str, storage_options: dict | None = None, *, retry: RetryPolicy | None = None,
                 prefetch_shards: int = 4, prefetch_bytes: int | None = None, threads: int = 2,
                 stats: IOStats | None = None):
        self.directory = directory
        self.storage_options = storage_options
        self.retry = retry or RetryPolicy()
        self.prefetch_shards = prefetch_shards
        self.prefetch_bytes = prefetch_bytes
        self.stats = stats or IOStats()
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="streambatch-prefetch")
        # Re-entrant: a future that is already done runs its callback (which
        # takes this lock) inside _top_up, which holds it.
        self._lock = threading.RLock()
        self._queue: list[ShardRef] = []
        self._futures: dict[ShardRef, Future] = {}
        self._taken: set[ShardRef] = set()
        self._failed: dict[ShardRef, ShardError] = {}
        self._sizes: dict[ShardRef, int] = {}
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

    def fetch(self, ref: ShardRef, block: bool = True) -> str | None:
        """Make sure the whole shard is in the cache and return its path.

        With ``block=False`` return None at once if another process is
        downloading it. Raises ShardError when the download fails (or failed
        in the process we waited for).
        """
        path = self.path(ref)
        if os.path.exists(path):
            return path
        os.makedirs(self.directory, exist_ok=True)
        base = os.path.join(self.directory, self.key(ref))
        waited_from = time.time()
        fd = os.open(base + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    return None
                raise
            if os.path.exists(path):
                return path  # another process finished it while we waited
            err = _recent_error(base + ".err", waited_from)
            if err is not None:  # the process we waited for gave up: do not retry all over again
                raise _with_partial(ShardError(err), base)
            self._download(ref, path, base)
            return path
        finally:
            os.close(fd)  # releases the lock

    def _download(self, ref: ShardRef, path: str, base: str) -> None:
        if ref.nbytes > 0:
            free = shutil.disk_usage(self.directory).free
            if free < ref.nbytes:
                raise ShardError(f"the shard cache {self.directory} has {free} bytes free, shard "
                                 f"{scrub_url(ref.url)} needs {ref.nbytes}; pass cache_dir= on a larger disk "
                                 "or lower prefetch_shards")
        shard = RemoteShard(ref.url, self.storage_options, size=ref.size, etag=ref.etag, retry=self.retry,
                            stats=self.stats)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".data")
        try:
            with os.fdopen(fd, "wb") as out:
                shard.download(out, ref.start, ref.end)
            os.replace(tmp, path)
        except ShardError as exc:
            if os.path.getsize(tmp):  # what did arrive stays readable: only the samples past it fail
                os.replace(tmp, base + ".partial")
            _write_text(base + ".err", str(exc))
            raise _with_partial(exc, base) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        if os.path.exists(base + ".err"):
            os.unlink(base + ".err")

    # ------------------------------------------------------------ prefetch

    def schedule(self, refs: list[ShardRef]) -> None:
        """The shards this process will read next, in the order it needs
        them (the rest of this window, then the next). Replaces the previous
        queue and starts background downloads within the prefetch bound."""
        with self._lock:
            self._queue = [r for r in refs if r not in self._taken]
            self._top_up()

    def _top_up(self) -> None:
        # caller holds self._lock
        ahead = [u for u in self._futures if u not in self._taken]
        nbytes = sum(self._sizes.get(u, 0) for u in ahead) if self.prefetch_bytes is not None else 0
        for ref in self._queue:
            if len(ahead) >= self.prefetch_shards or self._closed:
                break
            if ref in self._futures or ref in self._taken:
                continue
            if self.prefetch_bytes is not None and ahead and nbytes + ref.nbytes > self.prefetch_bytes:
                break
            fut = self._pool.submit(self._background, ref)
            fut.add_done_callback(lambda _f: self._after())
            self._futures[ref] = fut
            self._sizes[ref] = ref.nbytes
            ahead.append(ref)
            nbytes += ref.nbytes

    def _after(self) -> None:
        with self._lock:
            self._top_up()

    def _background(self, ref: ShardRef) -> str | ShardError | None:
        try:
            return self.fetch(ref, block=False)
        except ShardError as exc:
            return exc  # handed to the consumer by get()
        except Exception as exc:  # never let a prefetch thread die silently
            return ShardError(f"prefetching shard {scrub_url(ref.url)} failed: {exc!r}")

    def get(self, ref: ShardRef) -> str:
        """Path of the whole shard in the cache, waiting for (or doing) its
        download; raises ShardError (again, for every sample of a failed shard)."""
        if ref in self._failed:
            raise self._failed[ref]
        with self._lock:
            self._taken.add(ref)
            fut = self._futures.get(ref)
            self._top_up()
        result = fut.result() if fut is not None else None
        try:
            if isinstance(result, ShardError):
                raise result
            return result if isinstance(result, str) and os.path.exists(result) else self.fetch(ref)
        except ShardError as exc:
            self._failed[ref] = exc
            raise

    def release(self, ref: ShardRef, tag: str, consumers: int) -> None:
        """This process is done with ``ref`` for the window ``tag``; the last
        of its ``consumers`` deletes the file."""
        with self._lock:
            self._taken.discard(ref)
            self._futures.pop(ref, None)
            self._sizes.pop(ref, None)
        self._failed.pop(ref, None)
        base = os.path.join(self.directory, self.key(ref))
        done = f"{base}.{tag}.done"
        try:
            fd = os.open(done, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        except OSError:
            return
        try:
            os.write(fd, b"x")
            complete = os.fstat(fd).st_size >= consumers
        finally:
            os.close(fd)
        if complete:
            # The lock file goes too: a process that still waits on it would at
            # worst download the shard again, never read a torn file.
            for p in (base + ".data", done, base + ".err", base + ".lock", base + ".partial"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queue = []
        self._pool.shutdown(wait=True, cancel_futures=True)


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
