"""Window-by-window planning of an epoch over shards (pure numpy; no torch,
no I/O beyond the ``load_lengths`` callback).

Each epoch the shard order is a permutation drawn from (seed, epoch).
Consecutive shards form windows of at least ``window_samples`` samples (a
short remainder joins the last window). Windows are sized in samples, not
shards, because both the planner's balance and the memory follow the number
of samples planned together: the greedy planner's sort-then-chunk-shuffle
needs a few tens of thousands of samples to balance steps at >= 0.95. A window's
samples, plus the samples carried from the previous window, are planned with
``make_plan(drop_last=True)``: the partial final step is not trained on but
carried into the next window, so every step but the epoch's last is a full,
balanced planner step. The epoch's final window is planned with the user's
``drop_last``: padded (``drop_last=False``) or dropped (``True``), both
bounded by one step and counted.

With ``read_mode="shard"`` (remote shards) a window instead deals its
samples to ranks in contiguous pieces of whole and cut shards, and plans
steps in which every rank's batch holds only samples of its own pieces
(``affinity.py`` has the design): each shard byte is read by one rank.
Windows then also hold at least W shards, so that cutting adds at most one
ranged read per shard.

Everything is a pure function of (lengths, config, epoch), so every rank and
every DataLoader worker computes the same windows without talking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.plan import Plan
from ..planners import make_plan
from .affinity import foreign_samples, plan_affine_window

_U64 = 1 << 64
READ_MODES = ("sample", "shard")


def check_read_mode(mode: Any) -> str:
    """A read mode name, or ValueError listing the valid ones."""
    if not isinstance(mode, str) or mode not in READ_MODES:
        raise ValueError(
            f"read_mode must be one of {list(READ_MODES)} (or None to choose by URL: 'sample' for local files, "
            f"'shard' for remote or pipe: URLs), got {mode!r}"
        )
    return mode


def default_window(read_mode: str, world_size: int) -> int:
    """window_samples when the user gives none: 20,000, and in shard mode at
    least 2,500 per rank (each rank's own samples must be many enough to cut
    balanced batches from: see bench/affinity.py)."""
    return 20_000 if read_mode == "sample" else max(20_000, 2_500 * world_size)


@dataclass(frozen=True)
class WindowConfig:
    """Everything besides lengths and epoch that the plan depends on."""

    max_batch_tokens: int
    max_batch_size: int
    world_size: int
    window_samples: int
    shuffle: bool
    drop_last: bool
    seed: int
    planner: str = "greedy"
    planner_options: tuple = field(default=())
    read_mode: str = "sample"

    def key(self) -> tuple:
        key = (self.max_batch_tokens, self.max_batch_size, self.world_size, self.window_samples,
               self.shuffle, self.drop_last, self.seed, self.planner, repr(self.planner_options))
        # sample mode keeps its old key, so states saved before read_mode existed still load
        return key if self.read_mode == "sample" else key + (self.read_mode,)


@dataclass(frozen=True)
class Window:
    """One planned window.

    plan: the window's Plan; its sample indices address the arrays below.
    shard_ids: (n,) int64 shard of each planned sample (carried ones first).
    local: (n,) int64 index of that sample within its shard's sidecar.
    first_step: epoch step index of the window's first step.
    holder: shard mode only: (n,) int64 rank that streams (or carried in)
        each sample; every rank's batches hold only its own samples, except
        a few (see ``reads``).
    reads: shard mode only: (k, 4) int64 rows (rank, shard, lo, hi), sorted by
        rank: rank ``rank`` streams samples ``lo:hi`` (sidecar order) of
        ``shard``, row after row. Each new sample of the window is in exactly
        one row of the rank holding it. The carried-in samples (the first
        ``n_carried``) were read in an earlier window by their holder, which
        keeps them. A rank may also train a few samples it does not hold
        (pooled outliers; in the final window the tail planned across ranks
        and padding): each such sample follows its rank's pieces as a
        one-sample row (one ranged read).
    """

    index: int
    first_step: int
    plan: Plan
    shard_ids: np.ndarray
    local: np.ndarray
    last: bool
    holder: np.ndarray | None = None
    reads: np.ndarray | None = None
    n_carried: int = 0

    @property
    def num_steps(self) -> int:
        return self.plan.num_steps

    def rank_reads(self, rank: int) -> list[tuple[int, int, int]]:
        """Shard mode: [(shard, lo, hi)] that ``rank`` streams for this window,
        in order (samples lo:hi of the shard, i.e. one contiguous byte range)."""
        if self.reads is None:
            raise ValueError("rank_reads() is for read_mode='shard' windows")
        rows = self.reads[self.reads[:, 0] == rank]
        return [(int(s), int(lo), int(hi)) for _, s, lo, hi in rows]


@dataclass(frozen=True)
class EpochSummary:
    """One epoch of one world layout: ``steps`` per rank (= ``len(ds)``),
    ``samples`` distinct samples trained on, ``padded`` repeats added to fill
    the final step, ``dropped`` samples left out (``drop_last=True``),
    ``window_steps`` steps per window."""

    epoch: int
    steps: int
    samples: int
    padded: int
    dropped: int
    window_steps: tuple[int, ...]


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """(S,) int64 shard visiting order of an epoch: a permutation drawn from
    (seed, epoch) alone, or 0..S-1 without shuffling."""
    if not shuffle:
        return np.arange(num_shards, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % _U64, epoch, 0])))
    return rng.permutation(num_shards).astype(np.int64)


def window_seed(seed: int, epoch: int, window: int) -> int:
    """The planner seed of one window: distinct per (seed, epoch, window)."""
    words = np.random.SeedSequence([seed % _U64, epoch, window + 1]).generate_state(2, np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def window_bounds(counts: np.ndarray, window_samples: int, min_shards: int = 1) -> np.ndarray:
    """(n_windows + 1,) int64 cut points into a shard order: window j holds
    shards ``[b[j], b[j + 1])`` of it.

    counts: (S,) int64 samples per shard, in visiting order. A window closes
    once it holds ``window_samples`` samples and ``min_shards`` shards; a
    final remainder of fewer than half that many samples, or fewer than
    ``min_shards`` shards, joins the window before it.
    """
    cuts = [0]
    acc = 0
    for i, c in enumerate(counts.tolist()):
        acc += c
        if acc >= window_samples and i + 1 - cuts[-1] >= min_shards:
            cuts.append(i + 1)
            acc = 0
    if cuts[-1] != counts.shape[0]:
        short = acc < window_samples / 2 or counts.shape[0] - cuts[-1] < min_shards
        if short and len(cuts) > 1:
            cuts[-1] = counts.shape[0]
        else:
            cuts.append(counts.shape[0])
    return np.asarray(cuts, dtype=np.int64)


def iter_windows(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                 epoch: int) -> Iterator[Window]:
    """Plan an epoch window by window.

    counts: (S,) int64 samples per shard; load_lengths(shard) -> (n,) int64.
    Holds one window's arrays (plus at most one step of carried samples).
    """
    if config.read_mode == "shard":
        yield from _iter_affine(counts, load_lengths, config, epoch)
        return
    order = shard_order(counts.shape[0], config.seed, epoch, config.shuffle)
    bounds = window_bounds(counts[order], config.window_samples)
    nwin = bounds.shape[0] - 1
    carry_ids = carry_local = carry_len = np.zeros(0, dtype=np.int64)
    step = 0
    options = dict(config.planner_options)
    for j in range(nwin):
        shards = order[bounds[j] : bounds[j + 1]]
        lens = [np.asarray(load_lengths(int(s)), dtype=np.int64) for s in shards]
        ids = np.concatenate([carry_ids] + [np.full(x.shape[0], s, dtype=np.int64) for s, x in zip(shards, lens)])
        local = np.concatenate([carry_local] + [np.arange(x.shape[0], dtype=np.int64) for x in lens])
        lengths = np.concatenate([carry_len] + lens)
        last = j == nwin - 1
        plan = make_plan(lengths, config.max_batch_tokens, config.max_batch_size, config.world_size,
                         shuffle=config.shuffle, drop_last=config.drop_last if last else True,
                         seed=window_seed(config.seed, epoch, j), epoch=0, planner=config.planner, **options)
        left = plan.leftover if plan.leftover is not None else np.zeros(0, dtype=np.int64)
        if not last:
            carry_ids, carry_local, carry_len = ids[left], local[left], lengths[left]
        yield Window(j, step, plan, ids, local, last)
        step += plan.num_steps


def _iter_affine(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                 epoch: int) -> Iterator[Window]:
    """``iter_windows`` for read_mode='shard': windows of >= W shards planned
    by ``affinity.plan_affine_window``; carried samples keep their owner."""
    w = config.world_size
    order = shard_order(counts.shape[0], config.seed, epoch, config.shuffle)
    bounds = window_bounds(counts[order], config.window_samples, min_shards=w)
    nwin = bounds.shape[0] - 1
    none = np.zeros(0, dtype=np.int64)
    carry_ids = carry_local = carry_len = carry_holder = none
    step = 0
    options = dict(config.planner_options)
    for j in range(nwin):
        shards = order[bounds[j] : bounds[j + 1]]
        lens = [np.asarray(load_lengths(int(s)), dtype=np.int64) for s in shards]
        sizes = np.array([x.shape[0] for x in lens], dtype=np.int64)
        new_len = np.concatenate([none] + lens)
        last = j == nwin - 1
        aw = plan_affine_window(carry_len, carry_holder, new_len, config.max_batch_tokens, config.max_batch_size, w,
                                config.shuffle, last, config.drop_last, window_seed(config.seed, epoch, j), options)
        c = carry_ids.shape[0]
        ids = np.concatenate([carry_ids, np.repeat(shards, sizes)])
        local = np.concatenate([carry_local] + [np.arange(x.shape[0], dtype=np.int64) for x in lens])
        lengths = np.concatenate([carry_len, new_len])
        reads = _piece_reads(shards, sizes, aw.cuts)
        extra = foreign_samples(aw.plan, aw.holder)
        if extra.shape[0]:
            i = extra[:, 1]
            more = np.stack([extra[:, 0], ids[i], local[i], local[i] + 1], axis=1)
            reads = np.concatenate([reads, more])
            reads = reads[np.argsort(reads[:, 0], kind="stable")]
        if not last:
            left = aw.leftover
            carry_ids, carry_local, carry_len, carry_holder = ids[left], local[left], lengths[left], aw.holder[left]
        yield Window(j, step, aw.plan, ids, local, last, aw.holder, reads, c)
        step += aw.plan.num_steps


def _piece_reads(shards: np.ndarray, sizes: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """(k, 4) int64 rows (rank, shard, lo, hi): rank r's piece
    ``cuts[r]:cuts[r + 1]`` of the window's sample sequence, split where
    shards end (empty shards and empty pieces give no row)."""
    edges = np.concatenate([[0], np.cumsum(sizes)])
    rows = []
    for r in range(cuts.shape[0] - 1):
        a, b = int(cuts[r]), int(cuts[r + 1])
        if a == b:
            continue
        first = int(np.searchsorted(edges, a, side="right")) - 1
        for j in range(first, shards.shape[0]):
            lo, hi = max(a, int(edges[j])), min(b, int(edges[j + 1]))
            if lo >= b:
                break
            if lo < hi:
                rows.append((r, int(shards[j]), lo - int(edges[j]), hi - int(edges[j])))
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def summarize(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
              epoch: int) -> EpochSummary:
    """Plan the whole epoch (lengths only) and count what it trains on."""
    steps = padded = dropped = 0
    per_window = []
    for w in iter_windows(counts, load_lengths, config, epoch):
        steps += w.num_steps
        per_window.append(w.num_steps)
        if w.last:
            padded, dropped = w.plan.num_padded, w.plan.num_dropped
    samples = int(counts.sum()) - dropped
    return EpochSummary(epoch, steps, samples, padded, dropped, tuple(per_window))
