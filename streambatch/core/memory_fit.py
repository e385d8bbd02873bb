"""Fitting the memory model to measured peaks, and the search for the largest batch that fits.

``calibrate_memory`` calls a probe (``probe(batch_size, length) ->
Measurement``; ``torch_glue/memory_probe.py`` has the CUDA, in-process and
subprocess ones) on designed shapes (``cost_fit.design_shapes``, smallest
first), fits ``m0 + m1 * B * L + m2 * B * L**2`` (``cost_fit.fit_step``:
non-negative least squares on relative errors), and, given a memory limit,
searches per length for the largest batch whose real step fits
(``largest_batch``: double or shrink from the model's guess until one batch
fits and a larger fails, then bisect until the gap is under ``rel_gap`` of
the failing size, as NeMo's OOMptimizer does). ``combine_sizes`` draws the
limit curve through those measured points: the model's shape between them,
scaled to agree with each measurement and never above a batch size that
failed nor below one that fitted at a longer length.

Pure numpy and the standard library.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cost_fit import design_shapes, features, fit_step


@dataclass(frozen=True)
class Measurement:
    """One step's memory: ``peak_bytes`` (None when the probe cannot see the
    peak, only failures), ``oom``: the step ran out of memory, ``seconds``."""

    peak_bytes: int | None
    oom: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class Bisection:
    """The search at one length: ``ok`` the largest batch that fitted (0: not
    even one sample), ``fail`` the smallest that did not (None: none failed
    up to the cap), ``guess`` the model's prediction, ``trials`` [(B, fitted)]."""

    length: int
    guess: int
    ok: int
    fail: int | None
    trials: tuple[tuple[int, bool], ...]

    def to_dict(self) -> dict:
        return {"length": self.length, "model_batch": self.guess, "largest_fitting": self.ok,
                "smallest_failing": self.fail, "trials": [list(t) for t in self.trials]}


def largest_batch(fits: Callable[[int], bool], guess: int, cap: int, rel_gap: float = 0.05,
                  max_trials: int = 24) -> tuple[int, int | None, list[tuple[int, bool]]]:
    """(largest B that fits, smallest B that does not or None, trials) for
    ``fits(B)`` monotone in B, searched from ``guess`` in [1, cap]: up by x2
    (down by /2) until bracketed, then bisected until ``(fail - ok) / fail <=
    rel_gap`` or ``fail - ok == 1``."""
    ok, fail = 0, None
    trials: list[tuple[int, bool]] = []
    b = int(min(max(guess, 1), cap))
    while len(trials) < max_trials:
        good = bool(fits(b))
        trials.append((b, good))
        if good:
            ok = max(ok, b)
        else:
            fail = b if fail is None else min(fail, b)
        if fail is not None and (fail - ok <= 1 or (fail - ok) / fail <= rel_gap):
            break
        if fail is None:
            if ok >= cap:
                break
            b = min(cap, ok * 2)
        elif ok == 0:
            if fail == 1:
                break
            b = max(1, fail // 2)
        else:
            b = (ok + fail) // 2
    return ok, fail, trials


def fit_memory(shapes: np.ndarray, peaks: np.ndarray) -> tuple[float, float, float]:
    """Non-negative ``(m0, m1, m2)`` fitted to (K, 2) (batch size, length) shapes and (K,) peak bytes."""
    return fit_step(shapes, np.asarray(peaks, dtype=np.float64))


def model_batch(coefs: tuple[float, float, float], length: np.ndarray, budget: float) -> np.ndarray:
    """The model's largest batch per length under ``budget`` bytes (int64 >= 0)."""
    m0, m1, m2 = coefs
    L = np.asarray(length, dtype=np.float64)
    per = L * (m1 + m2 * L)
    top = float(np.iinfo(np.int32).max)  # length 0 costs nothing: any batch fits
    b = np.divide(max(budget - m0, 0.0), per, out=np.full(per.shape, top), where=per > 0)
    return np.minimum(np.floor(b), top).astype(np.int64)


def combine_sizes(model_sizes: np.ndarray, found: list[Bisection]) -> np.ndarray:
    """(L_max + 1,) int64 batch sizes: the model's (``model_sizes``), scaled by
    the measured ratio ``ok / model`` at each searched length (interpolated in
    between, held beyond; never below 1 where nothing failed up to the
    search's cap), then clipped per length ``L`` to ``[ok_j, fail_i - 1]``
    where ``L_j`` is the next searched length >= L (its fitting batch fits at
    any shorter length) and ``L_i`` the last one < L (its failing batch fails
    at any longer length)."""
    sizes = np.asarray(model_sizes, dtype=np.int64).copy()
    found = sorted((f for f in found if f.length < sizes.size), key=lambda f: f.length)
    if not found:
        return sizes
    L = np.arange(sizes.size, dtype=np.float64)
    at = np.array([f.length for f in found], dtype=np.float64)
    # nothing failed up to the cap: the batch that fits is at least ``ok``, so the model is not scaled down
    ratio = np.array([f.ok / max(f.guess, 1) if f.fail is not None else max(1.0, f.ok / max(f.guess, 1))
                      for f in found], dtype=np.float64)
    scaled = np.floor(sizes * np.interp(L, at, ratio)).astype(np.int64)
    lo = np.zeros(sizes.size, dtype=np.int64)
    hi = np.full(sizes.size, np.iinfo(np.int64).max, dtype=np.int64)
    prev = 0
    for f in found:
        lo[prev : f.length + 1] = np.maximum(lo[prev : f.length + 1], f.ok)
        if f.fail is not None:
            hi[f.length :] = np.minimum(hi[f.length :], f.fail - 1)
        prev = f.length + 1
    return np.clip(scaled, lo, hi)


def calibrate_memory(probe: Callable[[int, int], Measurement], shapes: np.ndarray | None = None, *,
                     max_batch_tokens: int | None = None, max_length: int | None = None,
                     max_batch_size: int | None = None, lengths: int = 6, limit_bytes: int | None = None,
                     margin: float = 0.9, bisect: int | list[int] | None = 4, rel_gap: float = 0.05,
                     max_seconds: float = 600.0, progress: Callable[[str], None] | None = None,
                     clock: Callable[[], float] = time.perf_counter
                     ) -> tuple[tuple[float, float, float], dict, list[Bisection]]:
    """Measure the peak of each shape, fit the model, and (with ``limit_bytes``)
    search the largest batch under ``margin * limit_bytes`` at ``bisect``
    lengths (a count spread over the designed lengths, or a list; 0/None:
    no search). Returns ``((m0, m1, m2), report, bisections)``."""
    if shapes is None:
        if max_batch_tokens is None or max_length is None:
            raise ValueError("pass shapes=(K, 2) (batch size, length) pairs, or max_batch_tokens and max_length "
                             "to design them")
        shapes = design_shapes(max_batch_tokens, max_length, max_batch_size, lengths)
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 2)
    if shapes.shape[0] < 3 or np.any(shapes < 1):
        raise ValueError(f"memory calibration needs >= 3 shapes with batch size and length >= 1, got "
                         f"{shapes.tolist()}")
    if not (isinstance(rel_gap, numbers.Real) and 0 < rel_gap < 1):
        raise ValueError(f"rel_gap must be in (0, 1) (0.05: stop when the largest fitting batch is within 5 % "
                         f"of the smallest failing one), got {rel_gap!r}")
    say = progress or (lambda msg: None)
    start = clock()
    order = np.lexsort((shapes[:, 0], shapes[:, 1] * shapes[:, 0] * (1 + shapes[:, 1])))
    shapes = shapes[order]  # smallest first: a failing shape tells us to skip larger ones at its length
    peaks: list[float] = []
    done: list[tuple[int, int]] = []
    oom: list[tuple[int, int]] = []
    for b, L in shapes.tolist():
        if done and clock() - start > max_seconds:
            break
        if any(ol == L and b >= ob for ob, ol in oom):
            continue
        m = probe(b, L)
        if m.oom:
            oom.append((b, L))
            say(f"  B={b:>5} L={L:>6}: out of memory")
            continue
        if m.peak_bytes is None:
            raise ValueError("this probe cannot see peak memory (no /proc/self/clear_refs on this system?); "
                             "measure in a subprocess (SubprocessProbe) or on a CUDA device")
        peaks.append(float(m.peak_bytes))
        done.append((b, L))
        say(f"  B={b:>5} L={L:>6}: peak {m.peak_bytes / 2**20:,.1f} MiB")
    if len(done) < 3:
        raise ValueError(f"only {len(done)} shapes were measured (out of memory: {oom}; within max_seconds="
                         f"{max_seconds:g}); use smaller shapes (max_batch_tokens, max_length) or a larger limit")
    got = np.array(done, dtype=np.int64)
    p = np.array(peaks)
    coefs = fit_memory(got, p)
    pred = features(got) @ np.array(coefs)
    err = (pred - p) / p * 100
    report: dict[str, Any] = {
        "shapes": [{"batch_size": int(b), "length": int(L), "peak_bytes": int(m), "predicted_bytes": int(q),
                    "error_pct": float(e)} for (b, L), m, q, e in zip(got.tolist(), p, pred, err)],
        "out_of_memory": [{"batch_size": b, "length": L} for b, L in oom],
        "median_abs_error_pct": float(np.median(np.abs(err))), "p90_abs_error_pct": float(np.percentile(np.abs(err),
                                                                                                        90)),
        "max_under_prediction_pct": float(max(0.0, -float(err.min()))),
        "shapes_measured": len(done), "shapes_designed": int(shapes.shape[0]),
    }
    found: list[Bisection] = []
    if limit_bytes is not None and bisect:
        budget = float(margin) * float(limit_bytes)
        targets = _bisect_lengths(bisect, np.unique(shapes[:, 1]))
        cap = int(max_batch_size) if max_batch_size is not None else 1 << 20
        for L in targets:
            guess = int(model_batch(coefs, np.array([L]), budget)[0])

            def fits(b: int, L: int = L) -> bool:
                m = probe(b, L)
                return not m.oom and (m.peak_bytes is None or m.peak_bytes <= budget)

            ok, fail, trials = largest_batch(fits, max(guess, 1), cap, rel_gap)
            found.append(Bisection(int(L), guess, ok, fail, tuple(trials)))
            say(f"  L={L:>6}: model says {guess}, largest that fitted {ok}"
                + (f", smallest that failed {fail}" if fail is not None else ""))
        report["bisection"] = [f.to_dict() for f in found]
        report["limit_bytes"], report["margin"] = int(limit_bytes), float(margin)
    report["seconds"] = float(clock() - start)
    return coefs, report, found


def _bisect_lengths(bisect: int | list[int], designed: np.ndarray) -> list[int]:
    if isinstance(bisect, bool):
        raise TypeError(f"bisect must be a number of lengths or a list of lengths, got {bisect!r}")
    if isinstance(bisect, numbers.Integral):
        k = min(int(bisect), designed.size)
        idx = np.unique(np.round(np.linspace(designed.size - 1, 0, k)).astype(np.int64)) if k > 0 else []
        return sorted(int(designed[i]) for i in idx)
    out = sorted({int(x) for x in bisect})
    if not out or out[0] < 1:
        raise ValueError(f"bisect lengths must be whole numbers >= 1, got {bisect!r}")
    return out
