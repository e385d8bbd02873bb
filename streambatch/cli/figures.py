"""Optional matplotlib figures of a plan and of planning throughput.

matplotlib (``pip install 'streambatch[plot]'``) is imported only inside
these functions, and without pyplot (no global backend or state)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

import numpy as np

from .metrics import Batches, step_balance


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
