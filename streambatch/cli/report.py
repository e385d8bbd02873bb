"""Plan quality: metrics, terminal histograms and optional matplotlib figures.

Pure numpy; matplotlib is imported only by the ``plot_*`` functions (an
optional extra: ``pip install 'streambatch[plot]'``). The metrics, used the
same way by ``streambatch plan`` and ``streambatch demo``:

- padding efficiency: sum of real lengths / sum over batches of B * L
  (B = batch size, L = longest length in the batch);
- balance efficiency: mean over steps of sum of the W batch costs /
  (W * the largest), cost B * L**2 (a synchronous step waits for its
  costliest batch);
- budget use: mean over batches of B * L / max_batch_tokens;
- planned epoch time: sum over steps of the step's costliest batch B * L**2
  (a synchronous step lasts as long as its slowest rank), in frames**2 (or
  length units**2); its lower bound for any plan is
  ``max(sum L**2 / W, max L**2)`` (``epoch_time_bound``);
- time-weighted balance: sum of all batch costs / (W x planned epoch time),
  the balance with each step weighted by its time (a slow step with idle
  ranks counts for what it costs, not as one step among many).
"""


from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.plan import Plan

_EIGHTHS = " ▏▎▍▌▋▊▉█"


@dataclass(frozen=True)
class Batches:
    """Per-batch statistics of one epoch, each (n_steps, W) int64 in training order.

    sizes: samples per batch (B); longest: longest length in the batch (L),
    0 for an empty batch; real: sum of the batch's lengths.
    """

    sizes: np.ndarray
    longest: np.ndarray
    real: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def world_size(self) -> int:
        return int(self.sizes.shape[1])

    def costs(self) -> np.ndarray:
        """(n_steps, W) float64 B * L**2 (float: no overflow on long lengths)."""
        return self.sizes * self.longest.astype(np.float64) ** 2


def plan_batches(plan: Plan, lengths: np.ndarray) -> Batches:
    """Batch statistics of ``plan`` over ``lengths`` ((N,) int, the lengths planned)."""
    lens = np.asarray(lengths, dtype=np.int64)[plan.samples]
    offsets = plan.offsets
    sizes = np.diff(offsets)
    longest = np.zeros(sizes.shape[0], dtype=np.int64)
    real = np.zeros(sizes.shape[0], dtype=np.int64)
    full = np.flatnonzero(sizes > 0)
    if full.size:
        starts = offsets[full]
        longest[full] = np.maximum.reduceat(lens, starts)
        real[full] = np.add.reduceat(lens, starts)
    order = plan.step_order
    w = plan.world_size
    return Batches(sizes.reshape(-1, w)[order], longest.reshape(-1, w)[order], real.reshape(-1, w)[order])


def rank_batches(per_rank: Sequence[Sequence[np.ndarray]]) -> Batches:
    """Batch statistics from lengths as delivered: ``per_rank[r][s]`` is the
    (B,) int lengths of rank ``r``'s batch at step ``s``. Every rank must
    have the same number of steps."""
    steps = {len(r) for r in per_rank}
    if len(steps) != 1:
        raise ValueError(f"ranks delivered different numbers of steps: {[len(r) for r in per_rank]}")
    n, w = steps.pop(), len(per_rank)
    sizes, longest, real = (np.zeros((n, w), dtype=np.int64) for _ in range(3))
    for r, batches in enumerate(per_rank):
        for s, b in enumerate(batches):
            b = np.asarray(b, dtype=np.int64)
            sizes[s, r] = b.size
            if b.size:
                longest[s, r] = b.max()
                real[s, r] = b.sum()
    return Batches(sizes, longest, real)


@dataclass(frozen=True)
class Quality:
    """Plan-quality metrics (see the module docstring); ratios in [0, 1].

    step_cost_spread: largest / median step cost, a step costing as much as
    its costliest batch (how much longer the slowest step runs).
    over_budget: batches with B * L > max_batch_tokens (a single sample
    longer than the budget forms such a batch of one).
    """

    steps: int
    world_size: int
    batches: int
    slots: int
    padding_efficiency: float
    balance_efficiency: float
    budget_use: float
    step_cost_spread: float
    over_budget: int
    epoch_time: float = 0.0
    time_balance: float = 1.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def quality(b: Batches, max_batch_tokens: int) -> Quality:
    """Metrics of batches ``b`` planned with ``max_batch_tokens``."""
    tokens = b.sizes * b.longest
    nonempty = b.sizes > 0
    padded = float(tokens.sum())
    padding = float(b.real.sum()) / padded if padded else 1.0
    top = b.costs().max(axis=1) if b.num_steps else np.zeros(0)
    balance = float(step_balance(b).mean()) if b.num_steps else 1.0
    use = float((tokens[nonempty] / max_batch_tokens).mean()) if nonempty.any() else 0.0
    median = float(np.median(top)) if b.num_steps else 0.0
    spread = float(top.max() / median) if median > 0 else 1.0
    epoch = float(top.sum())
    time_balance = float(b.costs().sum()) / (b.world_size * epoch) if epoch > 0 else 1.0
    return Quality(b.num_steps, b.world_size, int(nonempty.sum()), int(b.sizes.sum()), padding, balance, use,
                   spread, int((tokens > max_batch_tokens).sum()), epoch, time_balance)


def epoch_time_bound(lengths: np.ndarray, world_size: int) -> float:
    """A lower bound of the planned epoch time of any plan of ``lengths``
    ((N,) int): max(sum L**2 / W, max L**2). Every sample costs at least its
    own L**2 on some rank, and the longest alone takes a step."""
    sq = np.asarray(lengths, dtype=np.float64) ** 2
    return float(max(sq.sum() / world_size, sq.max())) if sq.size else 0.0


def step_balance(b: Batches) -> np.ndarray:
    """(n_steps,) float64 per-step balance: sum of costs / (W * max)."""
    costs = b.costs()
    top = costs.max(axis=1)
    out = np.ones(b.num_steps)
    ok = top > 0
    out[ok] = costs[ok].sum(axis=1) / (b.world_size * top[ok])
    return out


# ---------------------------------------------------------------- terminal


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
    """The metric lines of a report, aligned."""
    return [
        f"  steps per rank       {q.steps:,} (world size {q.world_size}, {q.batches:,} batches)",
        f"  padding efficiency   {q.padding_efficiency:.3f}   real / padded tokens (sum of lengths / sum of B*L)",
        f"  balance efficiency   {q.balance_efficiency:.3f}   per step, sum of rank costs / (W * max), cost B*L^2",
        f"  budget use           {q.budget_use:.3f}   mean batch B*L / max_batch_tokens",
        f"  step cost spread     {q.step_cost_spread:.2f}x   slowest step / median step (cost of its costliest batch)",
        f"  planned epoch time   {q.epoch_time:.4g}   sum over steps of the costliest batch B*L^2",
        f"  time-weighted bal.   {q.time_balance:.3f}   sum of all batch costs / (W * planned epoch time)",
    ] + ([f"  over budget          {q.over_budget:,} batches (single samples longer than the budget)"]
         if q.over_budget else [])


def mix_shares(plan: Plan, mix: Any) -> tuple[np.ndarray, np.ndarray]:
    """(S,) share of each source among the samples a mixed plan trains on
    (padding included), over the epoch and over its first 10 % of steps.
    The plan's samples index the sources' concatenated lengths."""
    from ..planners.interleave import step_counts

    labels = mix.source_of(np.arange(sum(mix.sizes)))
    counts = step_counts(plan, labels, mix.num_sources)[plan.step_order]
    whole = counts.sum(axis=0)
    early = counts[: max(1, int(round(0.1 * counts.shape[0])))].sum(axis=0)
    return whole / max(whole.sum(), 1), early / max(early.sum(), 1)


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


# ---------------------------------------------------------------- figures


def check_figure_path(path: str) -> str:
    """Fail before the work, not after it, when a figure cannot be written;
    return the path it will be written to."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'streambatch[plot]'") from None
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory: name the figure file, e.g. "
                                f"{os.path.join(path, 'plan.png')}", path)
    kinds = sorted(FigureCanvasAgg.get_supported_filetypes())
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in kinds:
        raise ValueError(f"cannot tell the figure format of {path!r} from its extension; end it in .png, .pdf "
                         f"or .svg (any of {', '.join('.' + k for k in kinds)})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, "no such directory to write the figure in", path)
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise PermissionError(errno.EACCES, "cannot write the figure there", path)
    return path


def _figure(nrows: int, ncols: int, size: tuple[float, float]):
    """A matplotlib Figure without pyplot (no global backend or state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'streambatch[plot]'") from None
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def plot_plan(path: str, b: Batches, max_batch_tokens: int, max_batch_size: int, title: str = "") -> None:
    """Write a PNG/PDF/SVG (by extension) of a plan: per-step cost across
    ranks, per-step balance, and batch size against longest length."""
    fig, ax = _figure(1, 3, (16, 4.6))
    costs = b.costs()
    stride = max(1, b.num_steps // 4000)  # a readable line, whatever the epoch length
    steps = np.arange(0, b.num_steps, stride)
    c = costs[steps]
    a = ax[0, 0]
    a.fill_between(steps, c.min(axis=1), c.max(axis=1), alpha=0.3, label="min-max over ranks", step="mid")
    a.plot(steps, c.mean(axis=1), lw=0.8, label="mean over ranks")
    a.set(xlabel="step (training order)" + (f", every {stride}th" if stride > 1 else ""),
          ylabel="batch cost B·L²", title="cost per step across ranks")
    a.legend(loc="upper right", fontsize=8)
    a = ax[0, 1]
    a.hist(step_balance(b), bins=40, range=(0, 1))
    a.set(xlabel="sum of costs / (W × max)", ylabel="steps", title="balance per step")
    a = ax[0, 2]
    size, longest = b.sizes.ravel(), b.longest.ravel()
    keep = size > 0
    size, longest = size[keep], longest[keep]
    if size.size > 20_000:  # a fixed subsample: the figure is deterministic too
        pick = np.random.default_rng(0).choice(size.size, 20_000, replace=False)
        size, longest = size[pick], longest[pick]
    a.scatter(longest, size, s=4, alpha=0.3, label="batches")
    if longest.size:
        x = np.linspace(max(1, longest.min()), longest.max(), 200)
        a.plot(x, np.minimum(max_batch_tokens / x, max_batch_size), color="C3", lw=1,
               label=f"budget {max_batch_tokens:,} / L, cap {max_batch_size}")
    a.set(xlabel="longest length in batch (L)", ylabel="batch size (B)", title="batch size against length")
    a.legend(loc="upper right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)


def plot_throughput(path: str, rows: Sequence[dict]) -> None:
    """Samples/s against N (one line per planner and W) and against W (one
    line per planner and N). rows: dicts with planner, n, world_size, samples_per_s."""
    fig, ax = _figure(1, 2, (12, 4.5))
    planners = sorted({r["planner"] for r in rows})
    for key, other, a, xlabel in (("n", "world_size", ax[0, 0], "samples N"),
                                  ("world_size", "n", ax[0, 1], "ranks W")):
        for p in planners:
            for v in sorted({r[other] for r in rows if r["planner"] == p}):
                pts = sorted((r[key], r["samples_per_s"]) for r in rows if r["planner"] == p and r[other] == v)
                if pts:
                    x, y = zip(*pts)
                    name = f"W={v}" if other == "world_size" else f"N={v:,.0f}"
                    a.plot(x, y, marker="o", label=f"{p}, {name}")
        a.set_xscale("log", base=2 if key == "world_size" else 10)
        a.set_yscale("log")
        a.set(xlabel=xlabel, ylabel="samples planned per second",
              title=f"planning throughput against {xlabel.split()[-1]}")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    fig.savefig(path, dpi=110)
