"""The reading side of remote shards for ``StreamingBatches``: one object per
DataLoader worker (or main process) that turns a window's plan into the
byte ranges ("pieces") its rank reads, prefetches them into the node-local
cache (``cache.py``), and reads samples from them by offset.

A piece is a contiguous byte range of one shard covering samples the rank
trains on in a window: the rank's needed samples of a shard, sorted by
offset, merged across gaps of up to ``GAP`` bytes. So the piece is the whole
shard when a rank reads all of it (or, in sample mode, a dense share of it),
exactly the rank's slice when a shard-affine plan cuts a shard between
ranks, and a single sample for a stray one; one GET each. Pieces stay one
window longer than their window, because a window's last partial step is
carried into the next window's plan: its samples are read from the pieces
that already hold them (a shard-affine piece covers the rank's whole rows,
carried samples included, and is held on while one is carried again).

The seam with planning is small: per window it uses the plan's batches for
this rank (``win.worker_steps``, ``win.rank_samples``), the sample -> shard map
(``win.shard_ids``, ``win.local``) and the next window, so it serves the
global (sample) plan and a shard-affine plan alike.

Stream: the sample bytes of a window's remote reads, prefetched through the cache."""

from __future__ import annotations

import os
from collections import deque

import numpy as np

from ...core.redact import scrub_url
from ..errors import ShardError
from .cache import ShardCache, ShardRef

GAP = 1 << 20  # bytes of unneeded samples worth downloading to save a request


class RemoteWindowReader:
    """Samples of remote shards for one process (a DataLoader worker).

    refs(shard) -> ShardRef of the whole shard (URL, size, ETag);
    table(shard, cache) -> (keys, offsets (n,) int64, sizes (n,) int64) from its sidecar;
    is_remote(shard) -> bool. worker / stride / start: this process's
    position in the rank's steps (worker w of N starts at step start and
    yields every N-th).
    """

    def __init__(self, cache: ShardCache, refs, table, is_remote, rank: int, worker: int, stride: int, start: int):
        self.cache, self.refs, self.table, self.is_remote = cache, refs, table, is_remote
        self.rank, self.worker, self.stride, self.start = rank, worker, stride, start
        self._pieces: dict[int, list[ShardRef]] = {}  # shard -> pieces readable now (this and the last window)
        self._held: list[list[tuple[ShardRef, str, int]]] = []  # per window: (piece, tag, consumers) to release
        # the last windows released: their pieces may wait for a slower worker, gone if the pass stops early
        self._released: deque[list[tuple[ShardRef, str, int]]] = deque(maxlen=2)
        self._fds: dict[ShardRef, int] = {}  # the cache's descriptors, and ``_own`` ones (partial downloads)
        self._own: set[int] = set()
        self._left = False
        self._tables: dict[int, tuple] = {}
        self._next: tuple | None = None  # (window index, my pieces in need order, consumers)
        self.bytes_read = 0

    # ------------------------------------------------------------ planning pieces

    def _table(self, shard: int):
        t = self._tables.get(shard)
        if t is None:
            t = self._tables[shard] = self.table(shard, self.cache)
        return t

    def _covered(self, shard: int, off: int, end: int, pieces: dict[int, list[ShardRef]]) -> bool:
        return any(p.start <= off and end <= p.end for p in pieces.get(shard, ()))

    def _plan(self, win, kept: dict[int, list[ShardRef]]):
        """(this worker's pieces in need order, {piece: consumers}, [(shard,
        piece)] of the rank) of a window; samples in ``kept`` pieces need none.
        A shard-affine window's pieces cover the rank's rows whole, with the
        samples it holds but carries into the next window untrained (else
        each would cost a ranged read of its own in the next window)."""
        base = self.start - self.worker
        per_worker = [win.rank_samples(self.rank, win.worker_steps(max(0, base + w), self.stride))
                      for w in range(self.stride)]
        needed = np.unique(np.concatenate(per_worker)) if per_worker else np.zeros(0, np.int64)
        shards = win.shard_ids[needed]
        locs = win.local[needed]
        if win.reads is not None and needed.size:  # (a window replayed before a resume reads nothing)
            rows = win.reads[win.reads[:, 0] == self.rank]
            n = rows[:, 3] - rows[:, 2]
            held = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n - rows[:, 2], n)
            shards, locs = np.concatenate([shards, np.repeat(rows[:, 1], n)]), np.concatenate([locs, held])
        pieces: list[tuple[int, ShardRef]] = []
        owner: dict[tuple[int, int], ShardRef] = {}  # (shard, local) -> piece
        for s in np.unique(shards).tolist():
            if not self.is_remote(s):
                continue
            _, offsets, sizes = self._table(s)
            loc = np.unique(locs[shards == s])
            offs, ends = offsets[loc], offsets[loc] + sizes[loc]
            order = np.argsort(offs, kind="stable")
            whole = self.refs(s)
            cur: list[int] = []
            for i in order.tolist():
                if self._covered(s, int(offs[i]), int(ends[i]), kept):
                    continue
                if cur and int(offs[i]) - int(ends[cur[-1]]) > GAP:
                    pieces.append((s, self._piece(whole, s, cur, loc, offs, ends, owner)))
                    cur = []
                cur.append(i)
            if cur:
                pieces.append((s, self._piece(whole, s, cur, loc, offs, ends, owner)))
        consumers: dict[ShardRef, int] = {}
        mine: dict[ShardRef, int] = {}
        for w, samples in enumerate(per_worker):
            touched = {owner[k] for k in zip(win.shard_ids[samples].tolist(), win.local[samples].tolist())
                       if k in owner}
            for p in touched:
                consumers[p] = consumers.get(p, 0) + 1
            if w == self.worker:
                for k_i, k in enumerate(zip(win.shard_ids[samples].tolist(), win.local[samples].tolist())):
                    if k in owner and owner[k] not in mine:
                        mine[owner[k]] = k_i
        in_order = sorted(mine, key=mine.get)
        return in_order, {p: consumers.get(p, 1) for _, p in pieces}, pieces

    @staticmethod
    def _piece(whole: ShardRef, shard: int, idx: list[int], loc, offs, ends, owner) -> ShardRef:
        start, end = int(offs[idx[0]]), int(max(ends[i] for i in idx))
        if start == 0 and whole.size is not None and end == whole.size:
            end = whole.size
        p = ShardRef(whole.url, whole.size, whole.etag, start, end)
        for i in idx:
            owner[(shard, int(loc[i]))] = p
        return p

    # ------------------------------------------------------------ windows

    def enter(self, epoch: int, win, nxt) -> None:
        """Start reading window ``win`` (``nxt``: the window after it, or None):
        release pieces two windows old, queue this window's pieces and the
        next one's for prefetch."""
        while len(self._held) >= 2:
            self._release(self._held.pop(0))
        kept = {s: list(ps) for s, ps in self._pieces.items()}
        carry = self._carry(nxt)
        order, consumers, pieces = self._plan(win, kept)
        tag = f"e{epoch}w{win.index}"
        group = [(p, tag, consumers[p]) for _, p in pieces]
        if carry is not None:
            # A sample carried on again (it came into this window and goes on to the next) stays in the
            # earlier window's piece: that piece is held one more window instead of being fetched again.
            still = {p for s, j in zip(*carry) for p in kept.get(int(s), ())
                     if p.start <= self._table(int(s))[1][j] < p.end}
            for held in self._held:
                group += [x for x in held if x[0] in still]
                held[:] = [x for x in held if x[0] not in still]
        self._held.append(group)
        for s, p in pieces:
            self._pieces.setdefault(s, []).append(p)
        upcoming = list(order)
        if nxt is not None:
            nkept = {s: list(ps) for s, ps in self._pieces.items()}
            upcoming += self._plan(nxt, nkept)[0]
        self.cache.schedule(upcoming)

    def _carry(self, nxt) -> tuple[np.ndarray, np.ndarray] | None:
        """(shards, locals) of the samples this rank holds that ``nxt`` carries in, or None."""
        if nxt is None or nxt.holder is None or not nxt.n_carried:
            return None
        mine = np.flatnonzero(nxt.holder[:nxt.n_carried] == self.rank)
        return (nxt.shard_ids[mine], nxt.local[mine]) if mine.size else None

    def shard_table(self, shard: int):
        """(keys, offsets, sizes) of a remote shard, read once per window."""
        return self._table(shard)

    def read(self, shard: int, offset: int, size: int) -> bytes:
        piece = next((p for p in self._pieces.get(shard, ()) if p.start <= offset and offset + size <= p.end), None)
        whole = self.refs(shard)
        if piece is None:  # not planned (cannot happen with a consistent plan): fetch just this sample
            piece = ShardRef(whole.url, whole.size, whole.etag, offset, offset + size)
            self._pieces.setdefault(shard, []).append(piece)
            if self._held:
                self._held[-1].append((piece, "adhoc", 1))
        fd = self._fds.get(piece)
        if fd is None:
            try:
                fd = self.cache.open(piece)  # held (a shared lock) until released: no other process deletes it
            except ShardError as exc:
                partial = getattr(exc, "partial", None)
                if partial is None or offset + size > piece.start + partial[1]:
                    raise
                fd = os.open(partial[0], os.O_RDONLY)  # the download failed after this sample: read what arrived
                self._own.add(fd)
            self._fds[piece] = fd
        buf = os.pread(fd, size, offset - piece.start)
        self.bytes_read += len(buf)
        if len(buf) != size:
            raise ShardError(f"shard {scrub_url(whole.url)} is truncated: the sidecar has a sample at bytes "
                             f"{offset}..{offset + size} but the downloaded bytes end at "
                             f"{piece.start + os.fstat(fd).st_size}; re-index it with `streambatch index --force`")
        return buf

    def _release(self, held: list[tuple[ShardRef, str, int]]) -> None:
        gone = {p for p, _, _ in held}
        for p in gone:
            fd = self._fds.pop(p, None)
            if fd in self._own:
                self._own.discard(fd)
                os.close(fd)
        for s in list(self._pieces):
            self._pieces[s] = [p for p in self._pieces[s] if p not in gone]
            if not self._pieces[s]:
                del self._pieces[s]
                self._tables.pop(s, None)
        for p, tag, consumers in held:
            self.cache.release(p, tag, consumers)
        self._released.append(held)

    def leave(self) -> None:
        """The epoch is done: release every piece (the last consumer deletes
        it), and the sidecar copies every worker of the rank read."""
        while self._held:
            self._release(self._held.pop(0))
        for ref in self.cache.sidecars:
            self.cache.release(ref, "sidecars", self.stride)
        self.cache.sidecars.clear()
        self._left = True

    def close(self) -> None:
        """Stop prefetching. A pass that did not reach its end (a loop that
        broke, an error) deletes the pieces and sidecar copies it knew of,
        except those another live worker holds (that worker's own close
        deletes them): without this, early-stopped passes fill the disk."""
        for fd in self._own:
            os.close(fd)
        self._own.clear()
        self._fds.clear()
        drop: list[tuple[ShardRef, tuple[str, ...]]] = []
        if not self._left:
            drop = [(p, (tag,)) for group in [*self._released, *self._held] for p, tag, _ in group]
            drop += [(ref, ("sidecars",)) for ref in self.cache.sidecars]
        self._held = []
        self._released.clear()
        self.cache.close(drop)
