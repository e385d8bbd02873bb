"""The node-local disk of the shard cache: where a run's cache lives, how
much room it has, and the errors it raises (``CacheError``).

Each rank of each run gets its own directory ``<root>/<host>-<pid>-r<rank>``
(``run_dir``); directories of runs on this host whose process is gone are
swept when a dataset is built (``sweep_dead_runs``). The disk is the
machine's, not the sample's: a full disk (ENOSPC, EDQUOT), one that is not
writable (EACCES, EPERM, EROFS, ENOTDIR, EISDIR) or a process out of
descriptors or memory is a ``CacheError`` (an OSError, not a ShardError:
never retried, never skipped by ``on_error="skip"``).

``DiskSpace`` is the room policy of one cache directory: prefetch starts a
download only while the disk has room for it and as much again (``pieces.py``);
a reader short of room first deletes this process's prefetched pieces it has
not reached (``cache.py``), then, with peers (the rank's other DataLoader
workers), deletes pieces no process holds and waits up to ``SPACE_WAIT``
seconds for them to free some (``wait_for_room``). Only a piece that still
does not fit is an error.

Stream: nothing: free bytes, run directories and the CacheError of a cache directory."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...core.redact import logger, scrub_url
from ..errors import CacheError

log = logger("streambatch.streaming")
SLACK = 64 << 10  # bytes a download needs beyond its own: lock and counter files, partly filled blocks
SPACE_WAIT = 30.0  # seconds a reader short of disk space waits for the rank's other workers to free some
SPACE_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT") if hasattr(errno, n))
_RESOURCES = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM))
_RUN_NAME = re.compile(r"^(?P<host>.+)-(?P<pid>\d+)-r(?P<rank>\d+)$")


# ---------------------------------------------------------------- run directories


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


def cache_estimate(catalog: Any, world_size: int, window_samples: int | None, rank_share: bool,
                   prefetch_shards: int, prefetch_bytes: int | None) -> int:
    """Bytes the rank's cache holds at most, roughly: two windows' share of
    the remote shards (1/W of a window when each rank streams its own share
    of a window, ``rank_share``: shard mode; up to all of it in sample mode,
    where every rank reads part of every shard) plus one worker's prefetch.
    An estimate (shard sizes vary, pieces are cut by the plan), so it only
    warns. 0 when no remote shard's size is known."""
    sizes = getattr(catalog, "sizes", None)
    if sizes is None:
        return 0
    local = catalog.local
    known = [int(sizes[k]) for k in range(len(catalog.urls)) if not local[k] and sizes[k] >= 0]
    if not known:
        return 0
    remote = int(len(catalog.urls) - local.sum())
    total = sum(known) * remote / len(known)
    samples = max(1, int(getattr(catalog, "num_samples", 0)))
    window = total * min(1.0, (window_samples or samples) / samples)
    share = window / max(1, world_size) if rank_share else window
    ahead = prefetch_shards * max(known)
    if prefetch_bytes is not None:
        ahead = min(ahead, prefetch_bytes + max(known))  # the first piece ahead starts whatever its size
    return int(2 * share + min(ahead, total))


def check_cache_dir(directory: str, cache_dir: str | None, need: int = 0, prefetch_shards: int = 4) -> None:
    """Create ``directory`` and write and remove a probe file in it, or raise
    CacheError naming it and ``cache_dir=``; log a warning when the disk has
    fewer than ``need`` bytes free (``cache_estimate``: an estimate, so no
    refusal: prefetch holds back on a full disk, and only a piece that cannot
    fit at all fails, when it is read)."""
    setting = f"cache_dir={cache_dir!r}" if cache_dir is not None else "cache_dir=None: the system temp dir"
    try:
        os.makedirs(directory, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".probe-")
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
            os.unlink(probe)
        free = shutil.disk_usage(directory).free
    except OSError as exc:
        raise CacheError(exc.errno, f"the shard cache directory {directory} ({setting}) is not usable: "
                         f"{exc.strerror or exc}; pass cache_dir= a writable directory on a local disk",
                         directory=directory) from None
    if free < need:
        log.warning("the shard cache %s (%s) has %d bytes free, less than the about %d this rank may hold (two "
                    "windows' share of its shards plus %d prefetched per DataLoader worker); if the disk fills, "
                    "prefetch holds back and a piece that still does not fit raises CacheError: pass cache_dir= "
                    "on a larger disk, or lower window_samples= or prefetch_shards=", directory, setting, free,
                    need, prefetch_shards)


# ---------------------------------------------------------------- one cache directory's room


class DiskSpace:
    """Free bytes, room-making and the ``CacheError`` of one cache directory.

    peers: the processes sharing ``directory`` (the rank's DataLoader
    workers); with more than one, a reader short of room waits up to
    ``SPACE_WAIT`` seconds for the others to free some (``wait_for_room``).
    """

    def __init__(self, directory: str, peers: int = 1):
        self.directory = directory
        self.peers = peers

    def free(self) -> int | None:
        try:
            return shutil.disk_usage(self.directory).free
        except OSError:
            return None

    def used(self) -> int:
        """Bytes the cache directory's files take on disk (what the rank's workers could free)."""
        total = 0
        with contextlib.suppress(OSError), os.scandir(self.directory) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
        return total

    def wait_for_room(self, free: int | None, want: float, must: int, sweep: Callable[[float], int | None]
                      ) -> int | None:
        """With peers, and ``free`` bytes short of ``must``: delete pieces no
        process holds (``sweep(want)``, which returns the bytes free) until
        ``must`` bytes are free or ``SPACE_WAIT`` seconds passed. Returns the bytes free."""
        if self.peers < 2 or free is None or free >= must or free + self.used() < must:
            return free  # no one else to wait for, or it would not fit even if they freed all they hold
        deadline = time.monotonic() + SPACE_WAIT
        while True:
            # Pieces no process holds: other workers' prefetches they have not reached, and pieces released
            # by some of their readers. A worker blocked by the DataLoader (its batches wait for this one's)
            # would never free its prefetches itself; deleting them costs at worst a second download.
            free = sweep(want) or 0
            if free >= must or time.monotonic() >= deadline:
                return free
            time.sleep(0.05)  # the rank's other workers release pieces as they move on

    def full(self, url: str, need: int, free: int | None) -> CacheError:
        return CacheError(errno.ENOSPC, f"the shard cache {self.directory} is full: {free} bytes free, a piece "
                          f"of shard {scrub_url(url)} needs {need or 'more'}; pass cache_dir= on a disk with "
                          "more room, or lower prefetch_shards= / prefetch_bytes= (downloads ahead, per DataLoader "
                          "worker) or window_samples= (the cache holds about two windows of this rank's shards)",
                          directory=self.directory)

    def error(self, exc: OSError, doing: str, url: str | None = None, need: int = 0) -> CacheError:
        """The CacheError for an OSError of the cache's own files (``url``,
        ``need``: the piece it was about, if any)."""
        if exc.errno in SPACE_ERRNOS:
            return self.full(url, need, self.free()) if url is not None else CacheError(
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
    def guard(self, doing: str, url: str | None = None, need: int = 0) -> Iterator[None]:
        """OSErrors of the cache's own files raised inside become ``CacheError``."""
        try:
            yield
        except CacheError:
            raise
        except OSError as exc:
            raise self.error(exc, doing, url, need) from None
