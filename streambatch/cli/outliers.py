"""Which few samples own the epoch: the outlier note of ``streambatch plan``.

A synchronous step lasts as long as its costliest batch, so a handful of very
long clips can set the time of the steps they land in. This module finds a
length limit that few samples exceed (at most ``max_share`` of them) and
whose removal cuts the planned epoch time the most, by planning again without
them, and words it for the report:

    the 53 samples over 60 s (0.10 % of samples) are in steps making 54 % of
    the planned epoch time; --max-length 60s would cut it by 31 %
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .metrics import Batches

# Candidate limits in seconds when the frame rate is known (round numbers read best).
_SECONDS = (5, 10, 15, 20, 25, 30, 40, 45, 60, 90, 120, 180, 300, 600, 1200, 3600)
_CANDIDATES = 5  # plans made per report: the longest limits few samples exceed


@dataclass(frozen=True)
class Outliers:
    """limit: length units; count: samples longer than it; share: part of the
    planned epoch time taken by the steps holding them; cut: relative drop of
    the planned epoch time when they are left out (planned again)."""

    limit: int
    count: int
    total: int
    share: float
    cut: float
    fps: float | None

    def limit_text(self) -> str:
        """The --max-length argument: seconds when the rate is known."""
        if self.fps:
            return f"{self.limit / self.fps:g}s"
        return str(self.limit)

    def text(self) -> str:
        over = f"{self.limit / self.fps:g} s" if self.fps else f"{self.limit:,}"
        return (f"the {self.count:,} samples over {over} ({self.count / self.total:.2%} of samples) are in steps "
                f"making {self.share:.0%} of the planned epoch time; --max-length {self.limit_text()} would cut "
                f"it by {self.cut:.0%}")


def candidate_limits(lengths: np.ndarray, fps: float | None, max_share: float) -> list[int]:
    """Up to ``_CANDIDATES`` limits (length units, descending) that 1 to
    ``max_share`` x N samples exceed: round seconds with a frame rate, else
    the lengths at the top 0.01 %, 0.03 %, 0.1 %, 0.3 % and 1 %."""
    n = lengths.size
    if fps:
        limits = [int(np.ceil(s * fps)) for s in _SECONDS]
    else:
        top = np.sort(lengths)[::-1]
        limits = [int(top[min(n - 1, int(f * n))]) for f in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)]
    out = []
    for limit in sorted(set(limits), reverse=True):
        over = int(np.count_nonzero(lengths > limit))
        if 1 <= over <= max_share * n:
            out.append(limit)
    return out[:_CANDIDATES]


def find_outliers(lengths: np.ndarray, batches: Batches, epoch_time: Callable[[np.ndarray], float],
                  fps: float | None = None, max_share: float = 0.01, min_cut: float = 0.03) -> Outliers | None:
    """The limit few samples exceed whose removal cuts the planned epoch time
    most, or None when no such limit cuts it by ``min_cut`` or more.

    lengths: (N,) int64 planned lengths; batches: their plan's statistics;
    epoch_time(kept_lengths) plans (M,) lengths with the same settings and
    returns the planned epoch time.
    """
    top = batches.costs().max(axis=1)
    full = float(top.sum())
    if full <= 0:
        return None
    best = None
    for limit in candidate_limits(lengths, fps, max_share):
        cut = 1.0 - epoch_time(lengths[lengths <= limit]) / full
        if cut >= min_cut and (best is None or cut > best[1] + 1e-9):
            best = (limit, cut)
    if best is None:
        return None
    limit, cut = best
    holding = (batches.longest > limit).any(axis=1)
    return Outliers(limit, int(np.count_nonzero(lengths > limit)), int(lengths.size), float(top[holding].sum()) / full,
                    cut, fps)
