"""The vocabulary of window-by-window planning (pure numpy; no torch, no I/O
beyond the ``load_lengths`` callback): ``WindowConfig``, the cuts and seeds
of an epoch's windows, the ``Window`` a loop yields, the ``EpochSummary``.

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
(``planners/shard_affine/planner.py`` has the design): each shard byte is read
by one rank. Windows then also hold at least W shards, so that cutting adds at
most one ranged read per shard. That epoch loop, with elastic resume, is
``shard_loop.py``; the sample-mode loop is ``sample_loop.py``.

Everything is a pure function of (lengths, config, epoch), so every rank and
every DataLoader worker computes the same windows without talking.

Stream: an epoch's shard order cut into windows (bounds, seeds, outlier holding) and the ``Window`` a loop yields."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..core.bounds import LengthCounts
from ..core.config import PlanConfig
from ..core.long_samples import DEFAULT_POLICY, check_max_length
from ..core.mix import Mix
from ..core.plan import Plan
from ..core.validation import check_int
from ..planners import RECOMMENDED
from .read_modes import READ_MODES, check_read_mode, iter_windows
from .step_budget import StepBudget

_U64 = 1 << 64


class ShardCatalog(Protocol):
    """What planning reads of a shard catalog (``streaming.shards.catalog.Catalog``): no bytes, lengths only."""

    counts: np.ndarray  # (S,) int64 samples per shard
    num_samples: int

    def lengths(self, shard: int) -> np.ndarray: ...  # (n,) the shard's sample lengths, in tar order

    def fingerprint(self) -> str: ...


class MixedShards(Protocol):
    """A mix of shard lists as one catalog (``streaming.shards.sources.SourceCatalog``): source i owns
    shards ``bounds[i]:bounds[i + 1]`` of ``catalog``; ``mix``: its sizes and per-epoch quotas."""

    catalog: ShardCatalog
    bounds: np.ndarray
    mix: Mix


@dataclass(frozen=True, init=False)
class WindowConfig(PlanConfig):
    """A ``PlanConfig`` plus the streaming window and read mode: everything
    besides lengths and epoch that a streamed epoch depends on. Build (and
    check) it with ``WindowConfig.build(..., window_samples=N, read_mode=M)``;
    the plain constructor takes values as they are, in streaming's order."""

    window_samples: int = 20_000
    read_mode: str = "sample"
    max_length: int | None = None  # longer samples are not planned (counted in Window.too_long)

    def __init__(self, max_batch_tokens: int, max_batch_size: int, world_size: int, window_samples: int,
                 shuffle: bool, drop_last: bool, seed: int, planner: str = RECOMMENDED,
                 planner_options: tuple[tuple[str, Any], ...] = (), read_mode: str = "sample",
                 max_length: int | None = None, long_samples: str = DEFAULT_POLICY) -> None:
        super().__init__(max_batch_tokens, max_batch_size, world_size, shuffle, drop_last, seed, planner,
                         planner_options, long_samples)
        object.__setattr__(self, "window_samples", window_samples)
        object.__setattr__(self, "read_mode", read_mode)
        object.__setattr__(self, "max_length", max_length)

    @classmethod
    def _check_extra(cls, window_samples: Any = 20_000, read_mode: Any = "sample",
                     max_length: Any = None) -> dict[str, Any]:
        return {"window_samples": check_int("window_samples", window_samples, 1),
                "read_mode": check_read_mode(read_mode),
                "max_length": check_max_length(max_length)[0]}

    @classmethod
    def _options_planner(cls, planner: str, extra: Mapping[str, Any]) -> str:
        # the read mode says which planner its windows are planned with (shard mode: the shard-affine walk)
        mode = READ_MODES.get(extra.get("read_mode", "sample"))
        return planner if mode is None else mode.planner_for(planner)

    @property
    def mode_tag(self) -> tuple[str, ...]:
        """What the read mode adds to fingerprint keys (nothing for ``"sample"``)."""
        return READ_MODES[self.read_mode].fingerprint_tag

    def key(self) -> tuple:
        # sample mode keeps its key, so states saved before read_mode existed still load
        key = super().key() + (self.window_samples,) + self.mode_tag
        # flat (a nested tuple cannot be hashed by config_fingerprint: StreamingBatches(max_length=...) failed)
        return key if self.max_length is None else key + ("max_length", self.max_length)


@dataclass(frozen=True)
class Window:
    """One planned window.

    plan: the window's Plan; its sample indices address the arrays below
        (an in-memory source's one window: the dataset's indices).
    shard_ids: (n,) int64 shard of each planned sample (carried ones first;
        None in memory).
    local: (n,) int64 index of that sample within its shard's sidecar (None in memory).
    first_step: epoch step index of the window's first step.
    too_long: samples of the window's shards the long-sample policy leaves out (longer than
        ``max_length``, or the budget with ``long_samples="drop"``), not planned.
    lengths: (n,) int64 planning length of each sample (the epoch summary's fewest steps).
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
    shard_ids: np.ndarray | None
    local: np.ndarray | None
    last: bool
    holder: np.ndarray | None = None
    reads: np.ndarray | None = None
    n_carried: int = 0
    too_long: int = 0
    lengths: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return self.plan.num_steps

    def planned_lengths(self) -> np.ndarray:
        """(k,) int64 lengths of the samples this window settles: those its
        steps train (padding repeats once), and in the epoch's last window
        those it drops; not those it carries into the next window."""
        if self.lengths is None:  # an internal invariant, kept under python -O too
            raise RuntimeError("planned_lengths needs the window's lengths (windows of the epoch plan carry them)")
        keep = np.zeros(self.lengths.shape[0], dtype=bool)
        keep[self.plan.samples] = True
        if self.last and self.plan.leftover is not None:
            keep[self.plan.leftover] = True
        return self.lengths[keep]

    def worker_steps(self, start: int, stride: int) -> range:
        """The window's epoch steps that the DataLoader worker starting at epoch
        step ``start`` with ``stride`` workers yields (``start, start + stride, ...``)."""
        return worker_steps(self.first_step, self.first_step + self.num_steps, start, stride)

    def rank_samples(self, rank: int, steps: range) -> np.ndarray:
        """(k,) int64 window sample indices of ``rank``'s batches of ``steps``, in step order."""
        if not steps:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([self.plan.batch(s - self.first_step, rank) for s in steps]).astype(np.int64)

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
    ``window_steps`` steps per window, ``too_long`` samples the long-sample
    policy left out (not in ``samples``), ``fewest_steps`` the fewest
    steps any plan of the epoch's samples can take at this world size
    (``core/bounds.py``; after an elastic resize, the steps trained before it
    plus the fewest of the rest; packed: a lower bound)."""

    epoch: int
    steps: int
    samples: int
    padded: int
    dropped: int
    window_steps: tuple[int, ...]
    too_long: int = 0
    fewest_steps: int | None = None

    @property
    def steps_ratio(self) -> float | None:
        """``steps / fewest_steps`` (1.0 when both are 0), or None when the fewest is not known."""
        if self.fewest_steps is None:
            return None
        if self.fewest_steps == 0:
            return 1.0 if self.steps == 0 else float("inf")
        return self.steps / self.fewest_steps


def summarize_windows(windows: Iterator[Window], samples: int, epoch: int, config: WindowConfig | None = None,
                      done: int = 0) -> EpochSummary:
    """An EpochSummary of planned windows; ``samples``: the epoch's samples
    (before drop and max_length). ``window_steps`` counts every planned piece;
    ``steps`` is where the last window ends (the steps of earlier elastic
    segments included, also when, as in memory, only the current one is planned).
    With ``config`` the summary gives the fewest steps: the ``done`` steps
    of finished elastic segments (windows starting before them count as
    planned) plus the fewest of every sample planned after them, under the
    batch rule as set (``epoch/step_budget.py``)."""
    steps = padded = dropped = over = 0
    per_window = []
    rest = LengthCounts()
    known = False  # the windows carry their lengths (the plan layer's over shards do; in memory, none)
    for w in windows:
        steps = w.first_step + w.num_steps
        over += w.too_long
        per_window.append(w.num_steps)
        if w.last:
            padded, dropped = w.plan.num_padded, w.plan.num_dropped
        known = known or w.lengths is not None
        if config is not None and w.first_step >= done and w.lengths is not None:
            rest.add(w.planned_lengths())
    fewest = None
    if config is not None and known:
        fewest = done + StepBudget(config.limits).fewest_of(rest, config.world_size, config.drop_last)
    return EpochSummary(epoch, steps, samples - dropped - over, padded, dropped, tuple(per_window), over, fewest)


def summarize(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
              epoch: int) -> EpochSummary:
    """Plan the whole epoch of one shard list (lengths only: ``read_modes.iter_windows``) and count what it
    trains on. counts: (S,) int64 samples per shard; load_lengths(shard) -> (n,) int64."""
    return summarize_windows(iter_windows(counts, load_lengths, config, epoch), int(counts.sum()), epoch, config)


def worker_steps(lo: int, hi: int, start: int, stride: int) -> range:
    """Epoch steps in ``[lo, hi)`` that the worker starting at ``start`` with
    ``stride`` workers yields: ``start, start + stride, ...``."""
    first = start if lo <= start else start + -(-(lo - start) // stride) * stride
    return range(first, hi, stride)


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


def outlier_limit(lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int) -> int:
    """Samples longer than this are outliers: alone they cost (L**2) more than
    a full batch of median-length samples (``min(cap, budget // median)`` of
    them). lengths: (n,) int64, n >= 1 (else no sample is an outlier)."""
    if lengths.size == 0:
        return np.iinfo(np.int64).max
    med = max(1, int(np.partition(lengths, lengths.size // 2)[lengths.size // 2]))
    full = max(1, min(max_batch_size, max_batch_tokens // med)) * med * med
    return int(np.sqrt(full))
