"""Plan reports for the terminal: histograms, metric and mix lines.

The metrics are ``metrics.py``'s (see its docstring), the matplotlib
figures ``figures.py``'s; both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .figures import check_figure_path, plot_plan, plot_throughput
from .metrics import (
    Batches,
    Quality,
    epoch_time_bound,
    mix_shares,
    plan_batches,
    quality,
    rank_batches,
    step_balance,
)

__all__ = ["Batches", "Quality", "audio_time", "bar", "check_figure_path", "epoch_time_bound", "format_mix",
           "format_quality", "histogram", "mix_shares", "nice_width", "plan_batches", "plot_plan",
           "plot_throughput", "quality", "rank_batches", "seconds_label", "step_balance"]

_EIGHTHS = " ▏▎▍▌▋▊▉█"


def nice_width(span: float, bins: int) -> int:
    """An integer bin width of 1, 2 or 5 times a power of ten covering ``span`` in ~``bins`` bins."""
    raw = max(1.0, span / max(1, bins))
    power = 10 ** int(np.floor(np.log10(raw)))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return int(m * power)
    return int(10 * power)


def bar(fraction: float, width: int) -> str:
    """A left-aligned unicode bar ``fraction`` (0..1) of ``width`` cells, in eighths."""
    eighths = int(round(max(0.0, min(1.0, fraction)) * width * 8))
    full, part = divmod(eighths, 8)
    s = "█" * full + (_EIGHTHS[part] if part else "")
    return s.ljust(width)


def histogram(values: np.ndarray, *, bins: int = 12, width: int = 32,
              label: Callable[[int, int], str] | None = None) -> list[str]:
    """Lines of a terminal histogram of non-negative integers.

    Bins are ``nice_width`` wide integer ranges ``[lo, hi]``; ``label(lo, hi)``
    names a bin (default ``"lo-hi"``). Each line: label, bar, count, percent.
    """
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return ["  (no values)"]
    lo, hi = int(values.min()), int(values.max())
    step = nice_width(hi - lo + 1, bins)
    start = (lo // step) * step
    counts = np.bincount((values - start) // step)
    label = label or (lambda a, b: f"{a:,}" if a == b else f"{a:,}-{b:,}")
    names = [label(start + i * step, min(hi, start + (i + 1) * step - 1)) for i in range(counts.size)]
    pad = max(len(n) for n in names)
    top = counts.max()
    total = values.size
    return [f"  {n:>{pad}} {bar(c / top, width)} {c:>10,} {100 * c / total:5.1f}%" for n, c in zip(names, counts)]


def seconds_label(frames_per_second: float | None) -> Callable[[int, int], str]:
    """Histogram labels in length units, with seconds when the rate is known."""
    def label(a: int, b: int) -> str:
        base = f"{a:,}" if a == b else f"{a:,}-{b:,}"
        if frames_per_second is None:
            return base
        return f"{base} ({a / frames_per_second:.1f}-{(b + 1) / frames_per_second:.1f} s)"

    return label


def audio_time(seconds: float) -> str:
    """'1,234.5 hours', '12.3 minutes' or '45.6 seconds'."""
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} hours"
    return f"{seconds / 60:.1f} minutes" if seconds >= 60 else f"{seconds:.1f} seconds"


def format_quality(q: Quality) -> list[str]:
    """The metric lines of a report, aligned (packed batches: tokens sum(L), cost sum(L^2))."""
    cost, tokens = ("sum(L^2)", "sum(L)") if q.packed else ("B*L^2", "B*L")
    padding = ("packed: no padding (sum of lengths = tokens)" if q.packed
               else "real / padded tokens (sum of lengths / sum of B*L)")
    return [
        f"  steps per rank       {q.steps:,} (world size {q.world_size}, {q.batches:,} batches)",
        f"  padding efficiency   {q.padding_efficiency:.3f}   {padding}",
        f"  balance efficiency   {q.balance_efficiency:.3f}   per step, sum of rank costs / (W * max), cost {cost}",
        f"  budget use           {q.budget_use:.3f}   mean batch {tokens} / max_batch_tokens",
        f"  step cost spread     {q.step_cost_spread:.2f}x   slowest step / median step (cost of its costliest batch)",
        f"  planned epoch time   {q.epoch_time:.4g}   sum over steps of the costliest batch {cost}",
        f"  time-weighted bal.   {q.time_balance:.3f}   sum of all batch costs / (W * planned epoch time)",
    ] + ([f"  over budget          {q.over_budget:,} batches (single samples longer than the budget)"]
         if q.over_budget else [])


def format_mix(names: Sequence[str], mix: Any, shares: tuple[np.ndarray, np.ndarray], epoch: int) -> list[str]:
    """Per source: size, epoch quota, target and realised share, share in the
    epoch's first 10 % of steps, and where its cycle stands at the epoch start."""
    width = max(8, *(len(n) for n in names))
    lines = [f"  {'source':<{width}}  {'samples':>11}  {'per epoch':>11}  {'target':>7}  {'realised':>8}  "
             f"{'first 10%':>9}  cycle:position"]
    for name, size, quota, target, share, early, (cycle, pos) in zip(
            names, mix.sizes, mix.counts, mix.proportions(), shares[0], shares[1], mix.positions(epoch)):
        lines.append(f"  {name:<{width}}  {size:>11,}  {quota:>11,}  {target:>7.3f}  {share:>8.3f}  {early:>9.3f}  "
                     f"{cycle}:{pos:,}")
    return lines
