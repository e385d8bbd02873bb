"""What a batch costs in memory: the model that limit curves are drawn from.

The peak memory of one training step on ``B`` samples padded to ``L`` is about

    m0 + m1 * B * L + m2 * B * L**2          bytes

``m0``: weights, gradients, optimizer state, the runtime; ``m1``: activations
per padded token (FFN, convolutions, the loss); ``m2``: activations per
``B * L**2`` (attention scores kept for backward without a fused kernel, an
attention decoder). A packed batch (samples concatenated, attention per
sample) peaks at ``m0 + m1 * sum(L_i) + m2 * sum(L_i**2)``.

``MemoryModel.fit(probe, ...)`` measures peaks on designed shapes and fits
the three coefficients (``memory_fit.py``); a probe measures one shape
(``torch_glue/memory_probe.py``: ``torch.cuda.max_memory_allocated`` on a GPU,
the peak resident memory of a subprocess on a CPU). ``limit_curve`` turns the
model into the largest batch per padded length under a memory limit
(``limits.LimitCurve``). Saved as JSON beside the time model
(``format: streambatch-memory``, ``version: 1``).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .limits import LimitCurve, check_length, read_json
from .memory_fit import Measurement, calibrate_memory, combine_sizes, model_batch

MEMORY_FORMAT = "streambatch-memory"
MEMORY_VERSION = 1
_SIZE = re.compile(r"^\s*([0-9][0-9_]*\.?[0-9]*(?:e[0-9]+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}


def parse_bytes(value: Any, name: str = "memory limit") -> int:
    """Bytes from 2_000_000_000, 2e9, "2GB", "1.5GiB" or "800MiB" (> 0)."""
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name} must be a size like 24GiB, 800MB or 2e9 (bytes), got {value!r}")
        value = float(m.group(1).replace("_", "")) * _UNITS[m.group(2).lower()]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 1:
        raise ValueError(f"{name} must be a number of bytes >= 1 (or a size like 24GiB), got {value!r}")
    return int(value)


def check_margin(margin: Any) -> float:
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not 0 < margin <= 1:
        raise ValueError(f"margin must be a fraction in (0, 1] of the memory limit (0.9 keeps 10 % free for what "
                         f"the step did not show: fragmentation, other processes), got {margin!r}")
    return float(margin)


@dataclass(frozen=True, repr=False)
class MemoryModel:
    """Peak bytes of a step: ``m0 + m1 * B * L + m2 * B * L**2`` (module docstring).

    measured: how the peaks were measured (``"cuda_max_memory_allocated"``,
    ``"cpu_peak_rss_subprocess"``, ``"cpu_peak_rss_in_process"``); device:
    the device they were measured on. Build with ``MemoryModel(m0, m1, m2)``,
    ``MemoryModel.fit(probe, ...)`` or ``MemoryModel.load("memory.json")``.
    """

    m0: float
    m1: float
    m2: float
    measured: str = "given"
    device: str = "unknown"
    # what a calibration found (set by fit and load; not part of the model's identity)
    fit_report = None  # dict: per shape measured / predicted bytes, errors, the searches
    limits = None  # LimitCurve under margin * limit_bytes, or None
    limit_bytes = None  # the memory limit the curve is drawn under (bytes), or None
    margin = None  # the fraction of it the curve uses, or None

    def __post_init__(self) -> None:
        for name in ("m0", "m1", "m2"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise ValueError(f"memory coefficient {name} must be a finite number of bytes >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.m1 <= 0 and self.m2 <= 0:
            raise ValueError(f"a memory model needs m1 > 0 or m2 > 0 (bytes per token or per B*L^2), got "
                             f"m1={self.m1}, m2={self.m2}; fit it with `streambatch calibrate --memory`")

    def peak(self, count: ArrayLike, max_len: ArrayLike) -> np.ndarray:
        """Predicted peak bytes of batches of ``count`` samples padded to ``max_len`` (float64)."""
        b = np.asarray(count, dtype=np.float64)
        L = np.asarray(max_len, dtype=np.float64)
        return self.m0 + b * L * (self.m1 + self.m2 * L)

    def packed_peak(self, sum_len: ArrayLike, sum_sq: ArrayLike) -> np.ndarray:
        """Predicted peak bytes of packed batches from their tokens and sum of squared lengths."""
        return self.m0 + self.m1 * np.asarray(sum_len, dtype=np.float64) + self.m2 * np.asarray(sum_sq, np.float64)

    def max_batch_size(self, length: ArrayLike, limit_bytes: float, margin: float = 1.0) -> np.ndarray:
        """The largest ``B`` with ``peak(B, L) <= margin * limit_bytes`` per length (int64, >= 0)."""
        budget = check_margin(margin) * parse_bytes(limit_bytes)
        return model_batch((self.m0, self.m1, self.m2), np.asarray(length, dtype=np.float64), budget)

    def limit_curve(self, limit_bytes: float, max_length: int, margin: float = 1.0) -> LimitCurve:
        """The largest batch per padded length 1..max_length under ``margin * limit_bytes``."""
        top = check_length(max_length)
        sizes = self.max_batch_size(np.arange(top + 1), limit_bytes, margin)
        gib = parse_bytes(limit_bytes) / 2**30
        return LimitCurve.from_sizes(sizes, f"memory model, {check_margin(margin):.0%} of {gib:.3g} GiB")

    # ------------------------------------------------------------ fitting

    @classmethod
    def fit(cls, probe: Callable[[int, int], Measurement], shapes: ArrayLike | None = None, *,
            measured: str | None = None, device: str | None = None, **options: Any) -> MemoryModel:
        """Measure ``probe(batch_size, length)`` (a ``Measurement``: peak bytes or
        out of memory) on designed shapes and fit the model. ``options``: see
        ``memory_fit.calibrate_memory`` (max_batch_tokens, max_length, lengths,
        limit_bytes, margin, bisect, rel_gap, max_seconds, progress). The report
        is on the returned model's ``fit_report``; with ``limit_bytes`` its
        ``limits`` is the calibrated ``LimitCurve`` (the model's, through the
        batch sizes the searched lengths measured), else None. ``measured`` and
        ``device`` default to the probe's attributes of those names."""
        if options.get("limit_bytes") is not None:
            options["limit_bytes"] = parse_bytes(options["limit_bytes"], "limit_bytes")
        if "margin" in options:
            options["margin"] = check_margin(options["margin"])
        coefs, report, found = calibrate_memory(probe, shapes, **options)
        model = cls(*coefs, measured=measured or getattr(probe, "measured", "probe"),
                    device=device or getattr(probe, "device", "unknown"))
        limits = None
        limit = options.get("limit_bytes")
        if limit is not None:
            margin = options.get("margin", 0.9)
            top = max([s["length"] for s in report["shapes"]] + [f.length for f in found]
                      + [int(options.get("max_length") or 0)])
            sizes = combine_sizes(model.max_batch_size(np.arange(top + 1), limit, margin), found)
            gib = parse_bytes(limit) / 2**30
            how = "model and search" if found else "model"
            limits = LimitCurve.from_sizes(sizes, f"memory {how}, {check_margin(margin):.0%} of {gib:.3g} GiB, "
                                                  f"{model.measured}")
        model._attach(report, limits, limit, options.get("margin", 0.9) if limit is not None else None)
        return model

    def _attach(self, report: dict | None, limits: LimitCurve | None, limit_bytes: Any, margin: Any) -> None:
        object.__setattr__(self, "fit_report", report)
        object.__setattr__(self, "limits", limits)
        object.__setattr__(self, "limit_bytes", None if limit_bytes is None else parse_bytes(limit_bytes))
        object.__setattr__(self, "margin", None if margin is None else check_margin(margin))

    # ------------------------------------------------------------ on disk

    def to_dict(self) -> dict:
        return {"format": MEMORY_FORMAT, "version": MEMORY_VERSION, "m0": self.m0, "m1": self.m1, "m2": self.m2,
                "units": "bytes; L in the planner's length units", "measured": self.measured, "device": self.device}

    @classmethod
    def from_dict(cls, d: dict, where: str = "memory") -> MemoryModel:
        if not isinstance(d, dict) or d.get("format") != MEMORY_FORMAT:
            raise ValueError(f"{where} is not a streambatch memory model (want a JSON object with format="
                             f"{MEMORY_FORMAT!r}, as `streambatch calibrate --memory` writes)")
        if d.get("version") != MEMORY_VERSION:
            raise ValueError(f"{where} is a memory model of format version {d.get('version')!r}; this streambatch "
                             f"reads version {MEMORY_VERSION}: upgrade streambatch or recalibrate")
        return cls(d.get("m0"), d.get("m1"), d.get("m2"), str(d.get("measured", "given")),
                   str(d.get("device", "unknown")))

    def save(self, path: str | os.PathLike, fit: dict | None = None, limits: LimitCurve | None = None,
             limit_bytes: int | None = None, margin: float | None = None) -> None:
        """Write the model, and what its calibration found (default: this model's
        ``fit_report``, ``limits``, ``limit_bytes``, ``margin``), as JSON."""
        fit = self.fit_report if fit is None else fit
        limits = self.limits if limits is None else limits
        limit_bytes = self.limit_bytes if limit_bytes is None else limit_bytes
        margin = self.margin if margin is None else margin
        d = self.to_dict()
        if limit_bytes is not None:
            d["limit_bytes"] = int(limit_bytes)
        if margin is not None:
            d["margin"] = float(margin)
        if limits is not None:
            d["limits"] = limits.to_dict()
        if fit is not None:
            d["fit"] = fit
        with open(path, "w") as f:
            json.dump(d, f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> MemoryModel:
        """A model written by ``save`` / ``streambatch calibrate --memory``, with
        what the calibration found (``limits``, ``limit_bytes``, ``margin``, ``fit_report``)."""
        where = repr(os.fspath(path))
        d = read_json(path, "memory model")
        model = cls.from_dict(d, where)
        limits = LimitCurve.from_dict(d["limits"], where) if isinstance(d.get("limits"), dict) else None
        model._attach(d.get("fit"), limits, d.get("limit_bytes"), d.get("margin"))
        return model

    def __repr__(self) -> str:
        return f"MemoryModel(m0={self.m0!r}, m1={self.m1!r}, m2={self.m2!r}, measured={self.measured!r})"

    def __str__(self) -> str:
        return f"{self.m0 / 2**20:.1f} MiB + {self.m1:.4g}*B*L + {self.m2:.4g}*B*L^2 bytes"
