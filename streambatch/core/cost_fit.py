"""Fitting a step cost model to measured step times.

A training step on a batch of ``B`` samples padded to ``L`` takes about
``c0 + c1 * B * L + c2 * B * L**2`` seconds (``CostModel.step``). Here:
the designed shapes to time (``design_shapes``), the non-negative least
squares fit on relative errors (``fit_step``; three unknowns, so the exact
optimum is found by trying every active set), and the timing loop
(``calibrate``) that calls the user's ``step_fn(batch_size, length)``.
Pure numpy and the standard library; a GPU is synchronised through torch
only if the caller already imported it.
"""

from __future__ import annotations

import itertools
import numbers
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def design_shapes(max_batch_tokens: int, max_length: int, max_batch_size: int | None = None,
                  lengths: int = 6) -> np.ndarray:
    """(K, 2) int64 (batch size, length) pairs spanning what a planner makes:
    ``lengths`` lengths from ``max_length / 32`` to ``max_length`` (geometric),
    each with 1 sample, a quarter, half and all of what the budget holds."""
    for name, v in (("max_batch_tokens", max_batch_tokens), ("max_length", max_length), ("lengths", lengths)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if max_batch_size is not None and (not isinstance(max_batch_size, numbers.Integral) or max_batch_size < 1):
        raise ValueError(f"max_batch_size must be an integer >= 1 or None, got {max_batch_size!r}")
    cap = int(max_batch_size) if max_batch_size is not None else 1 << 30
    ls = np.unique(np.geomspace(max(1, max_length / 32), max_length, int(lengths)).round().astype(np.int64))
    out = set()
    for L in ls.tolist():
        fits = max(1, min(cap, int(max_batch_tokens) // L))
        for b in {1, max(1, fits // 4), max(1, fits // 2), fits}:
            out.add((b, L))
    return np.array(sorted(out, key=lambda t: (t[1], t[0])), dtype=np.int64)


def features(shapes: np.ndarray) -> np.ndarray:
    """(K, 3) float64 columns ``1, B*L, B*L**2`` of (K, 2) (batch size, length) shapes."""
    s = np.asarray(shapes, dtype=np.float64).reshape(-1, 2)
    b, L = s[:, 0], s[:, 1]
    return np.stack([np.ones_like(b), b * L, b * L * L], axis=1)


def fit_step(shapes: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float]:
    """Non-negative ``(c0, c1, c2)`` minimising the sum of squared relative
    errors ``((pred - t) / t)**2`` over (K, 2) shapes and their (K,) measured
    seconds. Every active set of the three coefficients is solved and the best
    feasible one kept, which is the exact NNLS optimum."""
    t = np.asarray(seconds, dtype=np.float64).reshape(-1)
    x = features(shapes)
    if x.shape[0] != t.size or t.size < 3:
        raise ValueError(f"fitting needs >= 3 shapes with one time each, got {x.shape[0]} shapes and {t.size} times")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("measured step times must be finite and > 0 seconds")
    a = x / t[:, None]  # relative errors: each row divided by its own time, target 1
    norms = np.linalg.norm(a, axis=0)
    a = a / norms  # columns of unit length: B*L**2 is ~1e6 times B*L
    best, best_res = np.zeros(3), np.inf
    for k in (1, 2, 3):
        for cols in itertools.combinations(range(3), k):
            sol, *_ = np.linalg.lstsq(a[:, cols], np.ones(t.size), rcond=None)
            if np.any(sol < 0):
                continue
            c = np.zeros(3)
            c[list(cols)] = sol
            res = float(np.sum((a @ c - 1.0) ** 2))
            if res < best_res - 1e-15:
                best, best_res = c, res
    c0, c1, c2 = (best / norms).tolist()
    return c0, c1, c2


def _default_sync() -> Callable[[], None] | None:
    torch = sys.modules.get("torch")  # never imported here: a caller timing a GPU model has imported it
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.synchronize
    return None


def calibrate(step_fn: Callable[[int, int], Any], shapes: np.ndarray | None = None, *,
              max_batch_tokens: int | None = None, max_length: int | None = None,
              max_batch_size: int | None = None, repeats: int = 5, warmup: int = 2,
              max_seconds: float = 120.0, progress: bool = False,
              sync: Callable[[], None] | None = None,
              clock: Callable[[], float] = time.perf_counter) -> tuple[tuple[float, float, float], dict]:
    """Time ``step_fn(batch_size, length)`` on each shape (``shapes``, or
    ``design_shapes(max_batch_tokens, max_length, max_batch_size)``): ``warmup``
    untimed calls of the largest shape first, then per shape one untimed call
    and up to ``repeats`` timed ones (median), within ``max_seconds`` in all
    (shapes left when the time is up are dropped; at least 3 must be timed).
    Returns the fitted ``(c0, c1, c2)`` (``CostModel.step``'s) and a report:
    per shape the measured and predicted seconds and the error, and the
    median / p90 absolute error."""
    if shapes is None:
        if max_batch_tokens is None or max_length is None:
            raise ValueError("pass shapes=(K, 2) (batch size, length) pairs, or max_batch_tokens and max_length "
                             "to design them")
        shapes = design_shapes(max_batch_tokens, max_length, max_batch_size)
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 2)
    if shapes.shape[0] < 3 or np.any(shapes < 1):
        raise ValueError(f"calibration needs >= 3 shapes with batch size and length >= 1, got {shapes.tolist()}")
    for name, v, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    if not (isinstance(max_seconds, numbers.Real) and max_seconds > 0):
        raise ValueError(f"max_seconds must be > 0, got {max_seconds!r}")
    sync = sync if sync is not None else (_default_sync() or (lambda: None))

    def timed(b: int, L: int) -> float:
        sync()
        t0 = clock()
        step_fn(b, L)
        sync()
        return clock() - t0

    start = clock()
    big = shapes[np.argmax(shapes[:, 0] * shapes[:, 1] ** 2)]
    for _ in range(int(warmup)):
        step_fn(int(big[0]), int(big[1]))
    bar = _progress(len(shapes), progress)
    measured: list[float] = []
    for b, L in shapes.tolist():
        if measured and clock() - start > max_seconds:
            break
        step_fn(b, L)  # a shape's first call pays allocation and kernel selection
        ts = [timed(b, L)]
        while len(ts) < repeats and clock() - start <= max_seconds:
            ts.append(timed(b, L))
        measured.append(float(np.median(ts)))
        bar(1)
    bar(0, close=True)
    done = shapes[: len(measured)]
    if len(measured) < 3:
        raise ValueError(f"only {len(measured)} shapes were timed within max_seconds={max_seconds:g}; raise it "
                         "or pass fewer / smaller shapes")
    c0, c1, c2 = fit_step(done, np.array(measured))
    if c1 <= 0 and c2 <= 0:
        c1 = float(np.min(np.array(measured) / (done[:, 0] * done[:, 1])) * 1e-6)  # flat times: a token term > 0
    t = np.array(measured)
    pred = features(done) @ np.array([c0, c1, c2])
    err = (pred - t) / t * 100
    report = {
        "shapes": [{"batch_size": int(b), "length": int(L), "measured_s": float(m), "predicted_s": float(p),
                    "error_pct": float(e)} for (b, L), m, p, e in zip(done.tolist(), t, pred, err)],
        "median_abs_error_pct": float(np.median(np.abs(err))),
        "p90_abs_error_pct": float(np.percentile(np.abs(err), 90)),
        "shapes_timed": len(measured), "shapes_designed": int(shapes.shape[0]),
        "seconds": float(clock() - start), "repeats": int(repeats),
    }
    return (c0, c1, c2), report


def _progress(total: int, on: bool):
    if not on:
        return lambda n, close=False: None
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda n, close=False: None
    bar = tqdm(total=total, desc="timing shapes", unit="shape", leave=False)

    def step(n: int, close: bool = False) -> None:
        bar.update(n)
        if close:
            bar.close()

    return step
