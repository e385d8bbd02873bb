"""Bucket profiles of NeMo and lhotse, read as limit curves (``LimitCurve.from_profile``).

What those tools write, and how each reads (durations in seconds; with
``frames_per_second`` a bound ``d`` becomes ``ceil(d * fps)`` frames, the
rule every length source uses; without it the bounds are already length
units and a bound ``d`` admits lengths ``<= floor(d)``):

- NeMo's OOMptimizer output (``scripts/speech_recognition/oomptimizer.py``
  prints ``bucket_duration_bins=[...]`` and ``bucket_batch_size=[...]``), or a
  NeMo YAML/JSON config holding those keys at any depth (``model.train_ds``):
  bucket ``k`` holds clips up to ``bins[k]`` and batches of at most
  ``bucket_batch_size[k]``. 2D bins (``[[input, output], ...]``) give several
  sub-buckets per input bound: the smallest batch of them is kept (the
  planner knows one length, and the safe choice is the tightest).
- NeMo/lhotse duration budgets: ``bucket_duration_bins`` (or lhotse's
  ``duration_bins``) with ``batch_duration`` / ``max_duration`` seconds per
  batch (and ``quadratic_duration`` q: a clip of d seconds counts
  ``d + d**2 / q``; ``batch_size`` / ``max_cuts`` caps the count): a batch
  of ``B`` clips padded to ``d`` fits when ``B * cost(d) <= max_duration``.
  The curve follows that rule at every length up to the longest bound (or
  ``max_duration`` itself when no bins are given). In a mapping that also
  holds ``min_duration``, ``manifest_filepath`` or ``use_lhotse`` (a NeMo
  dataset config) ``max_duration`` is NeMo's clip-length filter, not a budget.
- lhotse's ``FixedBucketBatchSizeConstraint`` state (``max_seq_len_buckets``,
  ``batch_sizes``): as NeMo's profile.

Pure Python and numpy; YAML needs PyYAML (a dependency of webdataset).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .units import check_fps, seconds_to_frames

_PRINTED = re.compile(r"(bucket_duration_bins|bucket_batch_size)\s*[=:]\s*(\[[^\n]*\])")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
BIN_KEYS = ("bucket_duration_bins", "max_seq_len_buckets", "duration_bins")
SIZE_KEYS = ("bucket_batch_size", "batch_sizes")
DURATION_KEYS = ("batch_duration", "max_duration")
COUNT_KEYS = ("batch_size", "max_cuts")


def read_profile(profile: Any, frames_per_second: float | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(upper (K,) int64 length bounds, max_batch (K,) int64, a description) of a
    profile: a path (YAML, JSON or OOMptimizer's printed output) or a dict."""
    fps = check_fps(frames_per_second)
    if isinstance(profile, (str, os.PathLike)):
        where = os.fspath(profile)
        try:
            with open(where, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(f"cannot read the bucket profile {where!r}: {exc.strerror or exc}") from None
        data = parse_text(text, where)
        name = f"profile {os.path.basename(where)}"
    elif isinstance(profile, Mapping):
        data, name = dict(profile), "profile"
    else:
        raise TypeError(f"a bucket profile is a file path or a dict, got {type(profile).__name__}")
    found = find_keys(data)
    if found is None:
        raise ValueError(f"{name}: no bucket profile found; want bucket_duration_bins with bucket_batch_size "
                         "(NeMo, OOMptimizer), max_seq_len_buckets with batch_sizes (lhotse) or a duration "
                         "budget (batch_duration / max_duration, with optional bins)")
    unit = f"{fps:g} frames/s" if fps else "length units"
    if "sizes" in found:
        upper, sizes = _bucket_sizes(found["bins"], found["sizes"], fps, name)
        return upper, sizes, f"{name} ({upper.size} buckets, {unit})"
    upper, sizes = _duration_budget(found, fps, name)
    return upper, sizes, f"{name} (duration budget {found['duration']:g}, {unit})"


def parse_text(text: str, where: str) -> Any:
    """A profile file's content: OOMptimizer's printed lines, JSON or YAML."""
    text = _ANSI.sub("", text)
    printed = dict(_PRINTED.findall(text))
    if printed:
        out = {}
        for key, value in printed.items():
            try:
                out[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise ValueError(f"{where}: cannot read {key}={value[:80]}") from None
        return out
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml  # lazy for start-up: only a YAML profile needs it
    except ImportError:
        raise ImportError(f"{where} is not JSON; reading a YAML profile needs PyYAML: pip install pyyaml") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{where} is neither OOMptimizer output, JSON nor YAML ({exc})") from None


def find_keys(data: Any) -> dict[str, Any] | None:
    """The first mapping (depth first, in order) holding a profile's keys:
    {"bins", "sizes"} or {"bins"?, "duration", "q"?, "count"?}."""
    if isinstance(data, Mapping):
        bins = next((data[k] for k in BIN_KEYS if data.get(k) is not None), None)
        sizes = next((data[k] for k in SIZE_KEYS if data.get(k) is not None), None)
        # NeMo's own configs use max_duration as a clip-length filter (with min_duration), not a batch budget
        filters = any(k in data for k in ("min_duration", "manifest_filepath", "use_lhotse"))
        duration = next((data[k] for k in DURATION_KEYS if _number(data.get(k))
                         and not (k == "max_duration" and filters)), None)
        if bins is not None and sizes is not None and not _number(sizes):
            return {"bins": bins, "sizes": sizes}
        if duration is not None:
            count = next((data[k] for k in COUNT_KEYS if _number(data.get(k))), None)
            return {"bins": bins, "duration": float(duration), "q": data.get("quadratic_duration"), "count": count}
        for value in data.values():
            got = find_keys(value)
            if got is not None:
                return got
    elif isinstance(data, list):
        for value in data:
            got = find_keys(value)
            if got is not None:
                return got
    return None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _bounds(values: np.ndarray, fps: float | None) -> np.ndarray:
    """Length bounds (int64) of duration (or length-unit) bounds."""
    if fps is None:
        return np.floor(values + 1e-9).astype(np.int64)
    return np.asarray(seconds_to_frames(values, fps), dtype=np.int64)


def _bucket_sizes(bins: Any, sizes: Any, fps: float | None, name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        b = np.asarray(bins, dtype=np.float64)
        s = np.asarray(sizes, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: bucket bins and batch sizes must be lists of numbers, got {bins!r:.80} and "
                         f"{sizes!r:.80}") from None
    if b.ndim == 2 and b.shape[1] == 2:
        b = b[:, 0]  # 2D buckets (input, output): the input bound; sub-buckets merged below by the smallest size
    if b.ndim != 1 or s.ndim != 1 or b.size != s.size or b.size == 0:
        raise ValueError(f"{name}: want one batch size per bucket bin, got {b.size} bins and {s.size} sizes")
    if not (np.all(np.isfinite(b)) and np.all(b > 0) and np.all(np.isfinite(s)) and np.all(s >= 0)
            and np.all(s == np.floor(s))):
        raise ValueError(f"{name}: bins must be > 0 and batch sizes whole numbers >= 0, got {b.tolist()[:8]} and "
                         f"{s.tolist()[:8]}")
    if np.any(np.diff(b) < 0):
        raise ValueError(f"{name}: bucket bins must be sorted ascending (as NeMo and lhotse require), got "
                         f"{b.tolist()[:8]}")
    upper = _bounds(b, fps)
    if np.any(upper < 1):
        raise ValueError(f"{name}: a bucket bound below one length unit ({b.tolist()[:4]}); pass "
                         "frames_per_second when the bins are in seconds")
    keep = np.append(np.flatnonzero(np.diff(upper) != 0), upper.size - 1)  # last of each run of equal bounds
    out = np.array([s[(upper == upper[k])].min() for k in keep], dtype=np.int64)
    return upper[keep], out


def _duration_budget(found: dict[str, Any], fps: float | None, name: str) -> tuple[np.ndarray, np.ndarray]:
    duration, q, count = found["duration"], found.get("q"), found.get("count")
    if q is not None and not _number(q):
        raise ValueError(f"{name}: quadratic_duration must be a number > 0, got {q!r}")
    bins = found.get("bins")
    try:
        top = float(np.max(np.asarray(bins, dtype=np.float64).reshape(-1))) if bins else duration
    except (TypeError, ValueError):
        raise ValueError(f"{name}: duration bins must be a list of numbers, got {bins!r:.80}") from None
    top_len = int(_bounds(np.array([top]), fps)[0])
    if top_len < 1:
        raise ValueError(f"{name}: the longest bound {top} is below one length unit; pass frames_per_second")
    L = np.arange(1, top_len + 1, dtype=np.float64)
    d = L / fps if fps else L  # the longest duration of each padded length (a frame bound is ceil(d * fps))
    cost = d + (d * d / float(q) if q else 0.0)
    b = np.floor(duration / cost + 1e-9).astype(np.int64)
    if count is not None:
        b = np.minimum(b, int(count))
    keep = np.append(np.flatnonzero(np.diff(b) != 0), b.size - 1)
    return keep.astype(np.int64) + 1, b[keep]
