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

Everything is a pure function of (lengths, config, epoch), so every rank and
every DataLoader worker computes the same windows without talking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..core.plan import Plan
from ..planners import RECOMMENDED, make_plan

_U64 = 1 << 64


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
    planner: str = RECOMMENDED
    planner_options: tuple = field(default=())
    max_length: int | None = None  # longer samples are not planned (counted in Window.too_long)

    def key(self) -> tuple:
        extra = () if self.max_length is None else (self.max_length,)
        return (self.max_batch_tokens, self.max_batch_size, self.world_size, self.window_samples,
                self.shuffle, self.drop_last, self.seed, self.planner, repr(self.planner_options), *extra)


@dataclass(frozen=True)
class Window:
    """One planned window.

    plan: the window's Plan; its sample indices address the arrays below.
    shard_ids: (n,) int64 shard of each planned sample (carried ones first).
    local: (n,) int64 index of that sample within its shard's sidecar.
    first_step: epoch step index of the window's first step.
    too_long: samples of the window's shards longer than ``max_length``, not planned.
    """

    index: int
    first_step: int
    plan: Plan
    shard_ids: np.ndarray
    local: np.ndarray
    last: bool
    too_long: int = 0

    @property
    def num_steps(self) -> int:
        return self.plan.num_steps


@dataclass(frozen=True)
class EpochSummary:
    """One epoch of one world layout: ``steps`` per rank (= ``len(ds)``),
    ``samples`` distinct samples trained on, ``padded`` repeats added to fill
    the final step, ``dropped`` samples left out (``drop_last=True``),
    ``window_steps`` steps per window, ``too_long`` samples longer than
    ``max_length`` left out (not in ``samples``)."""

    epoch: int
    steps: int
    samples: int
    padded: int
    dropped: int
    window_steps: tuple[int, ...]
    too_long: int = 0


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


def window_bounds(counts: np.ndarray, window_samples: int) -> np.ndarray:
    """(n_windows + 1,) int64 cut points into a shard order: window j holds
    shards ``[b[j], b[j + 1])`` of it.

    counts: (S,) int64 samples per shard, in visiting order. A window closes
    once it holds ``window_samples`` samples; a final remainder of fewer than
    half that joins the window before it.
    """
    cuts = [0]
    acc = 0
    for i, c in enumerate(counts.tolist()):
        acc += c
        if acc >= window_samples:
            cuts.append(i + 1)
            acc = 0
    if cuts[-1] != counts.shape[0]:
        if acc < window_samples / 2 and len(cuts) > 1:
            cuts[-1] = counts.shape[0]
        else:
            cuts.append(counts.shape[0])
    return np.asarray(cuts, dtype=np.int64)


def outlier_limit(lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int) -> int:
    """Samples longer than this are outliers: alone they cost (L**2) more than
    a full batch of median-length samples (``min(cap, budget // median)`` of
    them). lengths: (n,) int64, n >= 1 (else no sample is an outlier)."""
    if lengths.size == 0:
        return np.iinfo(np.int64).max
    med = max(1, int(np.partition(lengths, lengths.size // 2)[lengths.size // 2]))
    full = max(1, min(max_batch_size, max_batch_tokens // med)) * med * med
    return int(np.sqrt(full))


def iter_windows(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                 epoch: int) -> Iterator[Window]:
    """Plan an epoch window by window.

    counts: (S,) int64 samples per shard; load_lengths(shard) -> (n,) int64.
    Holds one window's arrays (plus at most one step of carried samples and
    the held outliers).

    With shuffling, outliers (``outlier_limit``) are held back from window to window and
    planned together, in the last window or once they make a quarter of one:
    a step holding an outlier lasts as long as that sample alone, so outliers
    spread over every window would each set the time of a step of their own
    window (on Common Voice Pashto at W = 64, 20,000-sample windows without
    holding plan a 1.8x longer epoch than the whole corpus at once).
    """
    order = shard_order(counts.shape[0], config.seed, epoch, config.shuffle)
    bounds = window_bounds(counts[order], config.window_samples)
    nwin = bounds.shape[0] - 1
    carry_ids = carry_local = carry_len = np.zeros(0, dtype=np.int64)
    held_ids = held_local = held_len = np.zeros(0, dtype=np.int64)
    step = 0
    options = dict(config.planner_options)
    for j in range(nwin):
        shards = order[bounds[j] : bounds[j + 1]]
        lens = [np.asarray(load_lengths(int(s)), dtype=np.int64) for s in shards]
        ids = np.concatenate([carry_ids] + [np.full(x.shape[0], s, dtype=np.int64) for s, x in zip(shards, lens)])
        local = np.concatenate([carry_local] + [np.arange(x.shape[0], dtype=np.int64) for x in lens])
        lengths = np.concatenate([carry_len] + lens)
        over = 0
        if config.max_length is not None:
            keep = lengths <= config.max_length  # carried samples were kept already
            over = int(keep.size - np.count_nonzero(keep))
            if over:
                ids, local, lengths = ids[keep], local[keep], lengths[keep]
        last = j == nwin - 1
        if not last and config.shuffle:  # without shuffling, windows keep the corpus order
            out = lengths > outlier_limit(lengths, config.max_batch_tokens, config.max_batch_size)
            if out.any():
                held_ids, held_local, held_len = (np.concatenate([h, x[out]]) for h, x in
                                                  ((held_ids, ids), (held_local, local), (held_len, lengths)))
                ids, local, lengths = ids[~out], local[~out], lengths[~out]
        if held_len.size and (last or 4 * held_len.size >= config.window_samples):
            ids, local, lengths = (np.concatenate([x, h]) for x, h in
                                   ((ids, held_ids), (local, held_local), (lengths, held_len)))
            held_ids = held_local = held_len = np.zeros(0, dtype=np.int64)
        plan = make_plan(lengths, config.max_batch_tokens, config.max_batch_size, config.world_size,
                         shuffle=config.shuffle, drop_last=config.drop_last if last else True,
                         seed=window_seed(config.seed, epoch, j), epoch=0, planner=config.planner, **options)
        left = plan.leftover if plan.leftover is not None else np.zeros(0, dtype=np.int64)
        if not last:
            carry_ids, carry_local, carry_len = ids[left], local[left], lengths[left]
        yield Window(j, step, plan, ids, local, last, over)
        step += plan.num_steps


def summarize(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
              epoch: int) -> EpochSummary:
    """Plan the whole epoch (lengths only) and count what it trains on."""
    steps = padded = dropped = over = 0
    per_window = []
    for w in iter_windows(counts, load_lengths, config, epoch):
        steps += w.num_steps
        over += w.too_long
        per_window.append(w.num_steps)
        if w.last:
            padded, dropped = w.plan.num_padded, w.plan.num_dropped
    samples = int(counts.sum()) - dropped - over
    return EpochSummary(epoch, steps, samples, padded, dropped, tuple(per_window), over)
