"""The reading side of remote shards for ``StreamingBatches``: one object per
DataLoader worker (or main process) that turns a window's plan into the
list of shards to prefetch, reads samples by offset from the node-local
cache (``cache.py``), and tells the cache when a shard is done.

The seam with planning is small: for each window it needs the plan's
batches for this rank (``win.plan.batch(step, rank)``), the window's sample
-> shard map (``win.shard_ids``) and the next window. It works with the
global plan (each rank reads all shards of a window: one download per rank)
and with a shard-affine plan (each shard read by one rank: one download per
job), without knowing which.
"""

from __future__ import annotations

import os

import numpy as np

from .cache import ShardCache, ShardRef
from .errors import ShardError
from .remote import scrub_url


def worker_steps(lo: int, hi: int, start: int, stride: int) -> range:
    """Epoch steps in ``[lo, hi)`` that the worker starting at ``start`` with
    ``stride`` workers yields: ``start, start + stride, ...``."""
    first = start if lo <= start else start + -(-(lo - start) // stride) * stride
    return range(first, hi, stride)


def shards_in_order(win, rank: int, steps: range) -> np.ndarray:
    """(k,) int64 distinct shards the rank's batches of ``steps`` read, in the
    order they are first needed."""
    if not steps:
        return np.zeros(0, dtype=np.int64)
    lo = win.first_step
    ids = win.shard_ids[np.concatenate([win.plan.batch(s - lo, rank) for s in steps])]
    uniq, first = np.unique(ids, return_index=True)
    return uniq[np.argsort(first, kind="stable")]


class RemoteWindowReader:
    """Samples of remote shards for one process (a DataLoader worker).

    refs(shard) -> ShardRef gives the URL, size and ETag of a catalog shard.
    worker / stride / start: this process's position in the rank's steps
    (worker w of N starts at step start and yields every N-th).
    """

    def __init__(self, cache: ShardCache, refs, rank: int, worker: int, stride: int, start: int):
        self.cache, self.refs = cache, refs
        self.rank, self.worker, self.stride, self.start = rank, worker, stride, start
        self._fds: dict[int, int] = {}
        self._window: list[tuple[ShardRef, str, int]] = []  # (ref, tag, consumers) to release
        self.bytes_read = 0

    def enter(self, epoch: int, win, nxt) -> None:
        """Start reading window ``win`` (``nxt``: the window after it, or None):
        queue this window's shards and the next one's for prefetch."""
        self.leave()
        lo, hi = win.first_step, win.first_step + win.num_steps
        mine = shards_in_order(win, self.rank, worker_steps(lo, hi, self.start, self.stride))
        consumers = self._consumers(win)
        tag = f"e{epoch}w{win.index}"
        self._window = [(self.refs(int(s)), tag, consumers[int(s)]) for s in mine]
        upcoming = [ref for ref, _, _ in self._window]
        if nxt is not None:
            nlo, nhi = nxt.first_step, nxt.first_step + nxt.num_steps
            upcoming += [self.refs(int(s)) for s in
                         shards_in_order(nxt, self.rank, worker_steps(nlo, nhi, self.start, self.stride))]
        self.cache.schedule(upcoming)

    def _consumers(self, win) -> dict[int, int]:
        """How many of the rank's workers read each shard in this window (the
        others are assumed to start where this one does, shifted by their id)."""
        lo, hi = win.first_step, win.first_step + win.num_steps
        counts: dict[int, int] = {}
        base = self.start - self.worker
        for w in range(self.stride):
            for s in shards_in_order(win, self.rank, worker_steps(lo, hi, max(0, base + w), self.stride)).tolist():
                counts[s] = counts.get(s, 0) + 1
        return counts

    def read(self, shard: int, offset: int, size: int) -> bytes:
        fd = self._fds.get(shard)
        ref = self.refs(shard)
        if fd is None:
            path = self.cache.get(ref)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # evicted between download and open (a lagging worker): fetch again
                fd = os.open(self.cache.fetch(ref), os.O_RDONLY)
            self._fds[shard] = fd
        buf = os.pread(fd, size, offset)
        self.bytes_read += len(buf)
        if len(buf) != size:
            raise ShardError(f"shard {scrub_url(ref.url)} is truncated: the sidecar has a sample at bytes "
                             f"{offset}..{offset + size} but the downloaded shard has {os.fstat(fd).st_size} bytes; "
                             "re-index it with `streambatch index --force`")
        return buf

    def leave(self) -> None:
        """Done with the current window: close its files and let the cache
        delete those every worker has finished."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        window, self._window = self._window, []
        for ref, tag, consumers in window:
            self.cache.release(ref, tag, consumers)

    def close(self) -> None:
        """Stop prefetching; files of an unfinished window stay for the others."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._window = []
        self.cache.close()
