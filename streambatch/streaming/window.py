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
from ..planners import make_plan

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
    planner: str = "greedy"
    planner_options: tuple = field(default=())

    def key(self) -> tuple:
        return (self.max_batch_tokens, self.max_batch_size, self.world_size, self.window_samples,
                self.shuffle, self.drop_last, self.seed, self.planner, repr(self.planner_options))


@dataclass(frozen=True)
class Window:
    """One planned window.

    plan: the window's Plan; its sample indices address the arrays below.
    shard_ids: (n,) int64 shard of each planned sample (carried ones first).
    local: (n,) int64 index of that sample within its shard's sidecar.
    first_step: epoch step index of the window's first step.
    """

    index: int
    first_step: int
    plan: Plan
    shard_ids: np.ndarray
    local: np.ndarray
    last: bool

    @property
    def num_steps(self) -> int:
        return self.plan.num_steps


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


def iter_windows(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                 epoch: int) -> Iterator[Window]:
    """Plan an epoch window by window.

    counts: (S,) int64 samples per shard; load_lengths(shard) -> (n,) int64.
    Holds one window's arrays (plus at most one step of carried samples).
    """
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
