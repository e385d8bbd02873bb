"""Batch limits that are curves: the largest batch that fits, per padded length.

A token budget says ``B * L <= T``: one hyperbola, a guess at memory. Memory
grows like ``m0 + m1 * B * L + m2 * B * L**2`` (``core/memory.py``), so the
batch that fits falls faster than ``T / L`` on long clips. A ``LimitCurve``
holds the real limit as breakpoints: ``upper`` (K,) int64 strictly
increasing padded lengths and ``max_batch`` (K,) int64 non-increasing batch
sizes; a batch of ``B`` samples padded to ``L`` fits when ``B <=
max_batch[k]`` for the first ``k`` with ``L <= upper[k]``; lengths above
``upper[-1]`` fit no batch. That is the semantics of a NeMo/lhotse bucket
profile (``core/limit_profiles.py`` imports them), and ``table(L_max)`` is
the same curve as an (L_max + 1,) int32 lookup a Numba kernel can index.

A packed batch (samples concatenated, attention per sample) of ``T`` tokens
whose longest sample is ``L`` is checked as ``ceil(T / L)`` samples padded to
``L``: its memory, ``m1 * T + m2 * sum(L_i**2)``, is at most that padded
batch's, so the check is conservative.

Pure numpy. Planning under a curve: the planners' ``limit`` option
(``resolve_limit`` reads what it is given), held by the batch rule of
``core/constraint.py`` (the curve in ``BatchLimits``, its ``size_table`` in
``BatchConstraint``: the lookup the kernels index); ``budget_within`` gives
the largest token budget whose batches all lie under the curve (a plan
without the curve, e.g. the seed-exact greedy planner's).
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .limit_profiles import read_profile
from .plan import Plan

LIMITS_FORMAT = "streambatch-limits"
LIMITS_VERSION = 1
INT32_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True)
class BatchShapes:
    """Every batch of a plan, in training order, as (nb,) arrays (nb = steps x W).

    step: (nb,) int64 training-order step of each batch; rank: (nb,) int64;
    count: (nb,) int64 samples; max_len: (nb,) int64 longest length (the
    padded length); sum_len: (nb,) int64 real tokens; sum_sq: (nb,) float64
    sum of squared lengths (the attention of a packed batch); batch: (nb,)
    int64 index of the batch in the plan's storage (``plan.offsets``).
    """

    step: np.ndarray
    rank: np.ndarray
    count: np.ndarray
    max_len: np.ndarray
    sum_len: np.ndarray
    sum_sq: np.ndarray
    batch: np.ndarray

    def __len__(self) -> int:
        return int(self.count.shape[0])

    @classmethod
    def of_plan(cls, plan: Plan, lengths: ArrayLike, first_step: int = 0) -> BatchShapes:
        """The shapes of ``plan``'s batches; ``lengths``: (N,) lengths its sample
        indices address; ``first_step``: the epoch step of the plan's first step."""
        lens = np.asarray(lengths, dtype=np.int64)
        w = plan.world_size
        order = np.asarray(plan.step_order, dtype=np.int64)
        batch = (order[:, None] * w + np.arange(w, dtype=np.int64)[None, :]).reshape(-1)
        off = np.asarray(plan.offsets, dtype=np.int64)
        if off.size <= 1:
            z = np.zeros(0, dtype=np.int64)
            return cls(z, z, z, z, z, z.astype(np.float64), z)
        per = lens[np.asarray(plan.samples, dtype=np.int64)]
        starts = off[:-1]
        # every planned batch is non-empty (the planner contract), so reduceat sees no empty slice
        mx = np.maximum.reduceat(per, starts) if per.size else np.zeros(starts.size, dtype=np.int64)
        sm = np.add.reduceat(per, starts) if per.size else np.zeros(starts.size, dtype=np.int64)
        sq = np.add.reduceat(per.astype(np.float64) ** 2, starts) if per.size else np.zeros(starts.size)
        count = np.diff(off)
        steps = np.repeat(np.arange(order.size, dtype=np.int64) + first_step, w)
        ranks = np.tile(np.arange(w, dtype=np.int64), order.size)
        return cls(steps, ranks, count[batch], mx[batch], sm[batch], sq[batch], batch)

    @classmethod
    def concat(cls, parts: list[BatchShapes]) -> BatchShapes:
        if not parts:
            z = np.zeros(0, dtype=np.int64)
            return cls(z, z, z, z, z, z.astype(np.float64), z)
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                     ("step", "rank", "count", "max_len", "sum_len", "sum_sq", "batch")))

    def padded_equivalent(self, packed: bool) -> tuple[np.ndarray, np.ndarray]:
        """(count, length) of the padded batch each batch is checked as: itself,
        or for a packed batch ``ceil(sum_len / max_len)`` samples of ``max_len``."""
        if not packed:
            return self.count, self.max_len
        safe = np.maximum(self.max_len, 1)
        return np.maximum(-(-self.sum_len // safe), np.minimum(self.count, 1)), self.max_len


@dataclass(frozen=True)
class LimitCheck:
    """A plan checked against a curve: per batch (training order, ``shapes``)
    the batch size it is checked as (``count``), the curve's ``allowed`` size
    at its padded length, and ``over``: the batches above the curve."""

    shapes: BatchShapes
    count: np.ndarray
    allowed: np.ndarray
    packed: bool

    @property
    def over(self) -> np.ndarray:
        """(k,) int64 positions (into ``shapes``) of the batches above the curve."""
        return np.flatnonzero(self.count > self.allowed)

    @property
    def ok(self) -> bool:
        return self.over.size == 0

    @property
    def excess(self) -> np.ndarray:
        """(nb,) int64 samples above the curve per batch (<= 0: fits)."""
        return self.count - self.allowed

    def describe(self, limit: int = 5) -> str:
        s, over = self.shapes, self.over
        n = len(s)
        if over.size == 0:
            return f"all {n} batches are within the limit curve"
        worst = over[np.argsort(-(self.count[over] / np.maximum(self.allowed[over], 1)), kind="stable")][:limit]
        rows = ", ".join(f"step {s.step[i]} rank {s.rank[i]}: {self.count[i]} x {s.max_len[i]} "
                         f"(limit {self.allowed[i]})" for i in worst)
        return f"{over.size} of {n} batches exceed the limit curve; worst: {rows}"


@dataclass(frozen=True, eq=False)
class LimitCurve:
    """The largest batch that fits, as a function of padded length (module docstring).

    upper: (K,) int64 strictly increasing padded lengths (length units);
    max_batch: (K,) int64 >= 0, non-increasing: the largest batch size for a
    padded length ``L <= upper[k]`` (first such k); source: where it came from.
    Build with ``from_table``, ``from_memory``, ``from_profile`` or ``load``.
    """

    upper: np.ndarray
    max_batch: np.ndarray
    source: str = "table"
    meta: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        up = np.asarray(self.upper)
        mb = np.asarray(self.max_batch)
        if up.ndim != 1 or mb.ndim != 1 or up.size != mb.size or up.size == 0:
            raise ValueError(f"a limit curve needs as many length bounds as batch sizes (>= 1 each), got "
                             f"{up.size} bounds and {mb.size} sizes")
        for name, a in (("length bounds", up), ("batch sizes", mb)):
            if not np.issubdtype(a.dtype, np.number) or not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
                raise ValueError(f"the limit curve's {name} must be whole numbers, got {a.tolist()[:8]}")
        if np.any(up < 1) or np.any(np.diff(up) <= 0):
            raise ValueError(f"the limit curve's length bounds must be >= 1 and strictly increasing, got "
                             f"{up.tolist()[:8]}")
        if np.any(mb < 0):
            raise ValueError(f"the limit curve's batch sizes must be >= 0, got {mb.tolist()[:8]}")
        mb = np.minimum(mb, INT32_MAX).astype(np.int64)
        if np.any(np.diff(mb) > 0):
            # a longer padding never holds more samples: a profile that says otherwise is read as the safe
            # running minimum (recorded, so the caller can see it)
            self.meta["made_non_increasing"] = True
            mb = np.minimum.accumulate(mb)
        up = up.astype(np.int64)
        mb = mb.copy()
        up.flags.writeable = mb.flags.writeable = False  # hashed and fingerprinted by value: fixed once built
        object.__setattr__(self, "upper", up)
        object.__setattr__(self, "max_batch", mb)

    # ------------------------------------------------------------ building

    @classmethod
    def from_table(cls, upper: ArrayLike, max_batch: ArrayLike, source: str = "table") -> LimitCurve:
        """A curve from bucket upper bounds (length units) and the largest batch of each bucket."""
        return cls(np.asarray(upper), np.asarray(max_batch), source)

    @classmethod
    def from_sizes(cls, sizes: ArrayLike, source: str = "table") -> LimitCurve:
        """A curve from a per-length table: ``sizes[L]`` is the largest batch at
        padded length L, for L = 0 .. len(sizes) - 1 (runs of equal sizes become
        one breakpoint; ``sizes[0]`` is read as length 1's bucket)."""
        s = np.asarray(sizes)
        if s.ndim != 1 or s.size < 2:
            raise ValueError(f"sizes must be a (L_max + 1,) table of batch sizes per length, got shape {s.shape}")
        s = np.minimum.accumulate(np.maximum(s[1:], 0).astype(np.int64))
        last = np.append(np.flatnonzero(np.diff(s) != 0), s.size - 1)
        return cls(last + 1, s[last], source)

    @classmethod
    def from_memory(cls, model: Any, limit_bytes: float, max_length: int, margin: float = 1.0) -> LimitCurve:
        """The curve of a ``MemoryModel`` under ``margin * limit_bytes``, for lengths 1..max_length."""
        return model.limit_curve(limit_bytes, max_length, margin)

    @classmethod
    def from_profile(cls, profile: Any, frames_per_second: float | None = None) -> LimitCurve:
        """A NeMo or lhotse bucket profile (file path or dict; ``limit_profiles.read_profile``)."""
        upper, sizes, source = read_profile(profile, frames_per_second)
        return cls(upper, sizes, source)

    # ------------------------------------------------------------ asking

    @property
    def max_length(self) -> int:
        """The longest padded length any batch may have."""
        ok = np.flatnonzero(self.max_batch > 0)
        return int(self.upper[ok[-1]]) if ok.size else 0

    def max_batch_size(self, length: ArrayLike) -> np.ndarray:
        """The largest batch at padded length(s) ``length`` (int64; 0: none fits)."""
        L = np.asarray(length, dtype=np.int64)
        k = np.searchsorted(self.upper, L, side="left")
        out = np.where(k < self.upper.size, self.max_batch[np.minimum(k, self.upper.size - 1)], 0)
        return out.astype(np.int64)

    def fits(self, count: ArrayLike, length: ArrayLike) -> np.ndarray:
        """Does a batch of ``count`` samples padded to ``length`` fit (bool, broadcast)?"""
        return np.asarray(count, dtype=np.int64) <= self.max_batch_size(length)

    def table(self, max_length: int | None = None) -> np.ndarray:
        """(max_length + 1,) int32: ``table[L]`` is the largest batch at padded length L
        (``table[0] = table[1]``); the lookup a kernel indexes. Default: up to ``upper[-1]``."""
        top = int(self.upper[-1]) if max_length is None else int(max_length)
        if top < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length!r}")
        t = self.max_batch_size(np.arange(top + 1, dtype=np.int64))
        t[0] = t[1]
        return t.astype(np.int32)

    def size_table(self, max_length: int, max_size: int) -> np.ndarray:
        """(max_length + 1,) int64: the largest batch at padded length L for L in
        0..max_length, at most ``max_size`` and at least 1 (a lone sample is
        always a batch, as under a token budget: leave clips longer than the
        curve out with ``max_length``). Non-increasing in L: the planners'
        lookup (``BatchConstraint.size_table``)."""
        top = max(int(max_length), 1)
        t = self.table(top)[: int(max_length) + 1].astype(np.int64)
        return np.clip(t, 1, max(int(max_size), 1))

    def digest(self) -> str:
        """A short hash of the breakpoints: what plan fingerprints and saved states
        hold of the curve (``PlanConfig.key``), so a changed curve is a changed plan."""
        h = hashlib.sha256(self.upper.astype("<i8").tobytes())
        h.update(self.max_batch.astype("<i8").tobytes())
        return h.hexdigest()[:16]

    def check(self, plan: Plan, lengths: ArrayLike, packed: bool = False, first_step: int = 0) -> LimitCheck:
        """Check every batch of ``plan`` (``lengths``: (N,) the lengths its samples
        address) against the curve; packed batches as their padded equivalent."""
        shapes = BatchShapes.of_plan(plan, lengths, first_step)
        return self.check_shapes(shapes, packed)

    def check_shapes(self, shapes: BatchShapes, packed: bool = False) -> LimitCheck:
        count, length = shapes.padded_equivalent(packed)
        return LimitCheck(shapes, count, self.max_batch_size(length), bool(packed))

    def budget_within(self, max_length: int) -> tuple[int, int]:
        """(max_batch_tokens, binding length): the largest token budget whose
        padded batches (``B * L <= T``) all lie under the curve for lengths
        1..max_length. Lengths where the curve allows no batch are left out of
        the minimum (a lone clip over a budget is planned anyway: drop such clips
        with ``max_length``). ValueError when no length fits."""
        top = check_length(max_length)
        L = np.arange(1, top + 1, dtype=np.int64)
        b = self.max_batch_size(L)
        ok = b > 0
        if not ok.any():
            raise ValueError(f"the limit curve ({self.source}) allows no batch at any length up to {top}")
        # floor(T / L) <= b  <=>  T <= (b + 1) * L - 1
        cap = (b[ok] + 1) * L[ok] - 1
        i = int(np.argmin(cap))
        return int(cap[i]), int(L[ok][i])

    # ------------------------------------------------------------ on disk

    def to_dict(self) -> dict:
        return {"format": LIMITS_FORMAT, "version": LIMITS_VERSION, "source": self.source,
                "units": "upper: padded length in the planner's length units; max_batch: samples",
                "upper": self.upper.tolist(), "max_batch": self.max_batch.tolist()}

    @classmethod
    def from_dict(cls, d: dict, where: str = "limits") -> LimitCurve:
        if isinstance(d, dict) and d.get("format") == "streambatch-memory" and isinstance(d.get("limits"), dict):
            d = d["limits"]  # a memory calibration carries its curve
        if not isinstance(d, dict) or d.get("format") != LIMITS_FORMAT:
            raise ValueError(f"{where} is not a streambatch limit curve (want a JSON object with format="
                             f"{LIMITS_FORMAT!r} or a `streambatch calibrate --memory` file)")
        version = d.get("version")
        if version != LIMITS_VERSION:
            raise ValueError(f"{where} is a limit curve of format version {version!r}; this streambatch reads "
                             f"version {LIMITS_VERSION}: upgrade streambatch or recalibrate")
        return cls(np.asarray(d.get("upper", [])), np.asarray(d.get("max_batch", [])), str(d.get("source", "")))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> LimitCurve:
        """A curve written by ``save``, or the curve of a ``streambatch calibrate --memory`` file."""
        return cls.from_dict(read_json(path, "limit curve"), repr(os.fspath(path)))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, LimitCurve) and np.array_equal(self.upper, other.upper)
                and np.array_equal(self.max_batch, other.max_batch) and self.source == other.source)

    def __hash__(self) -> int:
        # by value, as ``__eq__``: a curve is an option of a PlanConfig, which is hashable (its arrays are
        # read-only)
        return hash((self.digest(), self.source))

    def __repr__(self) -> str:
        pts = ", ".join(f"<={u}: {b}" for u, b in zip(self.upper[:4].tolist(), self.max_batch[:4].tolist()))
        more = f", ... ({self.upper.size} breakpoints)" if self.upper.size > 4 else ""
        return f"LimitCurve({pts}{more}; {self.source})"


def resolve_limit(value: Any) -> LimitCurve | None:
    """The planners' ``limit`` option as a ``LimitCurve`` (None: no curve).

    value: a ``LimitCurve``; a ``MemoryModel`` carrying the curve its
    calibration drew under a memory limit (``MemoryModel.fit(...,
    limit_bytes=...)``, ``MemoryModel.load``); a path to a limit curve
    (``LimitCurve.save``), a ``streambatch calibrate --memory`` file or a
    NeMo/lhotse bucket profile (lengths in the planner's units); a dict of
    either; or a per-length table (``sizes[L]``: the largest batch at padded
    length L, ``LimitCurve.from_sizes``)."""
    if value is None or isinstance(value, LimitCurve):
        return value
    if hasattr(value, "limit_curve") and hasattr(value, "m2"):  # a MemoryModel (memory.py imports this module)
        if value.limits is None:
            raise ValueError("limit: this MemoryModel carries no limit curve; fit it with limit_bytes= "
                             "(`streambatch calibrate --memory --limit-bytes`), or pass "
                             "model.limit_curve(limit_bytes, max_length, margin)")
        return value.limits
    if isinstance(value, (str, os.PathLike)):
        try:
            return LimitCurve.load(value)
        except ValueError as first:
            try:
                return LimitCurve.from_profile(value)
            except (ValueError, TypeError) as second:
                raise ValueError(f"limit: {os.fspath(value)!r} is neither a limit curve or memory calibration "
                                 f"({first}) nor a bucket profile ({second})") from None
    if isinstance(value, dict):
        if value.get("format") in (LIMITS_FORMAT, "streambatch-memory"):
            return LimitCurve.from_dict(value, "limit")
        return LimitCurve.from_profile(value)
    if isinstance(value, (list, tuple, np.ndarray)):
        return LimitCurve.from_sizes(np.asarray(value), "per-length table")
    raise TypeError(f"limit must be a LimitCurve, a MemoryModel with a limit curve, a path to a limit/memory/profile "
                    f"file, a dict of one, or a per-length table of batch sizes (or None), got "
                    f"{type(value).__name__}")


def check_length(value: Any, name: str = "max_length") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= int(value) < 2**40:
        raise ValueError(f"{name} must be a whole number of length units in [1, 2**40), got {value!r}")
    return int(value)


def read_json(path: str | os.PathLike, what: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {os.fspath(path)!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{os.fspath(path)!r} is not JSON ({exc})") from None
