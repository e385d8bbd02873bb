"""Four audio-like utterance-length distributions shared by the benchmarks.

``make_lengths(name, n, seed)`` returns (n,) int64 lengths in frames at
``FRAME_RATE`` frames per second, a pure function of its arguments (numpy's
PCG64 seeded with ``seed``; no global RNG). Durations are drawn in seconds and
rounded up to whole frames.

- ``lognormal``: log-normal around 4 s (sigma 0.8), truncated to 0.5-30 s
  (12 % over 10 s); the generic shape of crawled speech.
- ``read``: read speech as LibriSpeech cuts it: 85 % massed at 12-16 s,
  12 % log-uniform 1-12 s (chapter ends, short sentences), 3 % 16-24 s.
- ``bimodal``: half short prompts (log-normal around 1.5 s, 0.5-4 s), half
  long utterances (log-normal around 15 s, 6-30 s), as in TTS prompt/target
  corpora.
- ``heavytail``: Pareto (alpha 1.4, from 1 s) truncated at 60 s: median
  1.6 s, 3.7 % over 10 s, 0.5 % over 30 s.
"""

from __future__ import annotations

import numpy as np

FRAME_RATE = 50
DISTRIBUTIONS = ("lognormal", "read", "bimodal", "heavytail")


def _truncated(draw, lo: float, hi: float, n: int) -> np.ndarray:
    """``n`` draws of ``draw(k)`` kept inside [lo, hi] (rejection, in order)."""
    out = np.empty(0)
    while out.size < n:
        x = draw(2 * (n - out.size) + 16)
        out = np.concatenate([out, x[(x >= lo) & (x <= hi)]])
    return out[:n]


def _mix(rng: np.random.Generator, parts: list[tuple[float, np.ndarray]], n: int) -> np.ndarray:
    """Shuffle together ``round(share * n)`` draws of each part."""
    counts = [int(round(share * n)) for share, _ in parts]
    counts[0] += n - sum(counts)
    out = np.concatenate([draw(c) for c, (_, draw) in zip(counts, parts)])
    return out[rng.permutation(n)]


def durations(name: str, n: int, seed: int) -> np.ndarray:
    """(n,) float64 durations in seconds."""
    rng = np.random.default_rng(seed)

    def lognormal(median, sigma, lo, hi):
        return lambda k: _truncated(lambda m: rng.lognormal(np.log(median), sigma, m), lo, hi, k)

    if name == "lognormal":
        return lognormal(4.0, 0.8, 0.5, 30.0)(n)
    if name == "read":
        return _mix(rng, [
            (0.85, lambda k: _truncated(lambda m: rng.normal(14.0, 1.0, m), 12.0, 16.0, k)),
            (0.12, lambda k: np.exp(rng.uniform(np.log(1.0), np.log(12.0), k))),
            (0.03, lambda k: rng.uniform(16.0, 24.0, k)),
        ], n)
    if name == "bimodal":
        return _mix(rng, [
            (0.5, lognormal(1.5, 0.35, 0.5, 4.0)),
            (0.5, lognormal(15.0, 0.3, 6.0, 30.0)),
        ], n)
    if name == "heavytail":
        return _truncated(lambda m: 1.0 + rng.pareto(1.4, m), 1.0, 60.0, n)
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {name!r}")


def make_lengths(name: str, n: int, seed: int = 0) -> np.ndarray:
    """(n,) int64 lengths in frames (``FRAME_RATE`` per second), all >= 1."""
    return np.ceil(durations(name, n, seed) * FRAME_RATE).astype(np.int64)
