"""Weighted mixing of several sources into one epoch (pure numpy).

Semantics (the same for the map-style sampler and the streaming dataset):

- **Sources and cycles.** Source ``i`` holds ``n_i`` samples. It is read as an
  endless stream of *cycles*; each cycle is one pass over all ``n_i`` samples
  in a fresh order drawn from (seed, i, cycle) (the identity without
  shuffling). So within a cycle every sample of the source comes exactly once.
- **Epoch quota.** Epoch ``e`` takes the next ``c_i`` samples of source
  ``i``'s stream: stream positions ``[e * c_i, (e + 1) * c_i)``. A
  down-sampled source (``c_i < n_i``) therefore continues its cycle in the
  next epoch; an up-sampled one (``c_i > n_i``) goes through whole cycles
  (each a new order) and continues the partial one in the next epoch.
  Where source ``i`` stands at the start of epoch ``e`` is
  ``divmod(e * c_i, n_i)`` = (cycle, position): two integers, no per-sample
  state, a pure function of the epoch.
- **Quotas from the spec.** Either every source has a ``weight`` (the epoch
  holds ``samples_per_epoch`` samples, default the sum of the source sizes,
  split by largest remainders: each ``c_i`` is within one sample of
  ``weight_i / sum(weights) * samples_per_epoch``), or none has: then each
  gives ``samples`` (an absolute count per epoch) or ``repeat`` (``c_i =
  round(repeat * n_i)``; default ``repeat=1``: every sample once per epoch).
- **Planning.** The epoch's drawn samples (``sum c_i`` of them, a sample
  appearing several times when its source is up-sampled past a cycle) are
  planned together by the ordinary planner, so every global step is balanced
  and token-budgeted across ranks over the mixed lengths, exactly as for one
  corpus of those lengths.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .types import IntLike

_U64 = 1 << 64
_MIX_TAG = 0x6D6978  # "mix": keeps these seed sequences apart from the window seeds


@dataclass(frozen=True)
class SourceSpec:
    """How much of one source an epoch takes: exactly one of ``weight``
    (relative share), ``samples`` (count per epoch) or ``repeat`` (times the
    source's size per epoch); all None means ``repeat=1``."""

    weight: float | None = None
    samples: int | None = None
    repeat: float | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("weight", "samples", "repeat") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"a source takes one of weight, samples or repeat, got {' and '.join(given)}")
        for k in ("weight", "repeat"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)
                                  or not np.isfinite(float(v)) or float(v) < 0):
                raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
        n = self.samples
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0):
            raise ValueError(f"samples must be an integer >= 0 (samples per epoch), got {self.samples!r}")


def specs_from(n: int, weights: Sequence[float] | np.ndarray | None = None,
               samples: Sequence[int] | np.ndarray | None = None,
               repeats: Sequence[float] | np.ndarray | None = None) -> list[SourceSpec]:
    """One SourceSpec per source from per-source lists (at most one list given;
    none: every source once per epoch)."""
    given = [(k, v) for k, v in (("weights", weights), ("samples", samples), ("repeats", repeats)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give one of weights, samples or repeats, not {' and '.join(k for k, _ in given)}")
    if not given:
        return [SourceSpec() for _ in range(n)]
    name, given_values = given[0]
    values: list[Any] = (list(np.asarray(given_values).tolist()) if isinstance(given_values, np.ndarray)
                         else list(given_values))
    if len(values) != n:
        raise ValueError(f"{name} must have one entry per source ({n}), got {len(values)}")
    field = {"weights": "weight", "samples": "samples", "repeats": "repeat"}[name]
    return [SourceSpec(**{field: v}) for v in values]


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """(S,) int64 counts summing to ``total``, proportional to ``weights``
    (largest remainders; ties go to the lower index)."""
    share = weights / weights.sum() * total
    counts = np.floor(share).astype(np.int64)
    rest = total - int(counts.sum())
    if rest > 0:
        order = np.lexsort((np.arange(weights.shape[0]), -(share - counts)))
        counts[order[:rest]] += 1
    return counts


@dataclass(frozen=True)
class Mix:
    """Sizes and per-epoch quotas of the sources of one mixed epoch.

    sizes: samples in each source; counts: samples each epoch takes from it.
    Global sample index = source offset + index within the source (the order
    of ``torch.utils.data.ConcatDataset`` over the sources).
    """

    sizes: tuple[int, ...]
    counts: tuple[int, ...]

    @classmethod
    def build(cls, sizes: Sequence[int], specs: Sequence[SourceSpec] | None = None,
              samples_per_epoch: IntLike | None = None) -> Mix:
        """Check the specs and turn them into per-epoch counts (see module doc)."""
        sizes = tuple(int(s) for s in sizes)
        if not sizes:
            raise ValueError("a mix needs at least one source")
        specs = list(specs) if specs is not None else [SourceSpec() for _ in sizes]
        if len(specs) != len(sizes):
            raise ValueError(f"got {len(specs)} source specs for {len(sizes)} sources")
        for i, (n, s) in enumerate(zip(sizes, specs)):
            if not isinstance(s, SourceSpec):
                raise TypeError(f"source {i}: expected a SourceSpec, got {s!r}")
            if n == 0:
                raise ValueError(f"source {i} holds no samples; remove it from the mix")
        weighted = [s.weight is not None for s in specs]
        if any(weighted) and not all(weighted):
            raise ValueError("either every source has a weight or none has: give the others weights too, or use "
                             "samples=/repeat= on every source")
        if all(weighted):
            w = np.array([s.weight for s in specs], dtype=np.float64)
            if w.sum() <= 0:
                raise ValueError(f"weights must not all be 0, got {w.tolist()}")
            if samples_per_epoch is None:
                total = sum(sizes)
            else:
                if isinstance(samples_per_epoch, bool) or not isinstance(samples_per_epoch, numbers.Integral) \
                        or samples_per_epoch < 1:
                    raise ValueError(f"samples_per_epoch must be an integer >= 1, got {samples_per_epoch!r}")
                total = int(samples_per_epoch)
            counts = apportion(total, w)
        else:
            if samples_per_epoch is not None:
                raise ValueError("samples_per_epoch applies to weighted sources; with samples=/repeat= the epoch "
                                 "is their sum")
            counts = np.array([s.samples if s.samples is not None else
                               int(round((1.0 if s.repeat is None else s.repeat) * n))
                               for n, s in zip(sizes, specs)], dtype=np.int64)
        if counts.sum() == 0:
            raise ValueError("the mix takes no samples per epoch; raise a weight, samples or repeat")
        return cls(sizes, tuple(int(c) for c in counts))

    @property
    def num_sources(self) -> int:
        return len(self.sizes)

    @property
    def samples_per_epoch(self) -> int:
        return int(sum(self.counts))

    @property
    def offsets(self) -> np.ndarray:
        """(S + 1,) int64 first global index of each source, then the total."""
        return np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    def proportions(self) -> np.ndarray:
        """(S,) float64 share of each source in an epoch."""
        c = np.asarray(self.counts, dtype=np.float64)
        return c / c.sum()

    def positions(self, epoch: int) -> list[tuple[int, int]]:
        """Per source, (cycle, position in that cycle) at the start of ``epoch``."""
        return [divmod(epoch * c, n) for n, c in zip(self.sizes, self.counts)]

    def key(self) -> str:
        """A string naming the mix, for configuration fingerprints."""
        return f"mix{list(self.sizes)}{list(self.counts)}"

    def source_of(self, index: np.ndarray) -> np.ndarray:
        """(n,) int64 source of each global sample index."""
        return np.searchsorted(self.offsets, np.asarray(index, dtype=np.int64), side="right") - 1

    def draw(self, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
        """(samples_per_epoch,) int64 global indices of epoch ``epoch``'s
        samples: source 0's quota, then source 1's, ... (each in stream order)."""
        out = np.empty(self.samples_per_epoch, dtype=np.int64)
        at = 0
        for i, (off, n, c) in enumerate(zip(self.offsets.tolist(), self.sizes, self.counts)):
            for cycle, lo, hi in stream_pieces(n, epoch * c, (epoch + 1) * c):
                out[at : at + hi - lo] = cycle_slice(n, seed, i, cycle, lo, hi, shuffle) + off
                at += hi - lo
        return out


def stream_pieces(n: int, start: int, stop: int) -> list[tuple[int, int, int]]:
    """Stream positions ``[start, stop)`` of a source of ``n`` as (cycle, lo, hi)
    pieces: positions ``lo:hi`` of that cycle's order."""
    pieces = []
    while start < stop:
        cycle, lo = divmod(start, n)
        hi = min(n, lo + stop - start)
        pieces.append((cycle, lo, hi))
        start += hi - lo
    return pieces


def cycle_key(seed: int, source: int, cycle: int) -> int:
    """The 64-bit key of one cycle's order: drawn from (seed, source, cycle)."""
    words = np.random.SeedSequence([seed % _U64, source, cycle, _MIX_TAG]).generate_state(2, np.uint32)
    return (int(words[0]) << 32) | int(words[1])


def cycle_slice(n: int, seed: int, source: int, cycle: int, lo: int, hi: int, shuffle: bool = True) -> np.ndarray:
    """(hi - lo,) int64 positions ``lo:hi`` of one cycle's order of a source
    of ``n``: a permutation drawn from (seed, source, cycle) alone, or
    ``0..n-1`` without shuffling. Costs O(hi - lo) time and memory."""
    if not shuffle:
        return np.arange(lo, hi, dtype=np.int64)
    from .shuffle import permutation_slice  # lazy for start-up: no numba before the first plan

    return permutation_slice(n, cycle_key(seed, source, cycle), lo, hi)


def cycle_order(n: int, seed: int, source: int, cycle: int, shuffle: bool = True) -> np.ndarray:
    """(n,) int64 order of one whole cycle (see ``cycle_slice``)."""
    return cycle_slice(n, seed, source, cycle, 0, n, shuffle)
