"""What a batch costs: the model planners balance ranks and steps with.

A batch of ``B`` samples padded to ``L`` costs

    linear               B * L                 (tokens: memory, or a conv/RNN model)
    quadratic            B * L**2              (the seed's attention proxy; the default)
    quadratic_duration   B * (L + L**2 / q)    (lhotse's ``quadratic_duration``)

``q`` is in the same units as the lengths (frames or tokens, not seconds:
lhotse's ``quadratic_duration=30`` at 50 frames/s is ``q=1500``).

``step`` is a measured model of one training step, in seconds:

    step                 c0 + c1 * B * L + c2 * B * L**2   (fitted by ``CostModel.fit``)

``c0`` (per step: optimizer, all-reduce, launches) is the same for every
batch of a step, so ranks are balanced under ``c1 * B * L + c2 * B * L**2``:
up to a constant factor that is ``quadratic_duration`` with ``q = c1 / c2``
(rounded), ``linear`` when ``c2 = 0`` and ``quadratic`` when ``c1 = 0``, and
the kernels get exactly that model. ``c0`` counts in the epoch time,
``sum over steps of (c0 + the step's costliest batch)``.

A *packed* batch (``pack=True``: samples concatenated, attention restricted
to each one) has no padding: it costs the sum of its samples' costs alone,
``sum(c1 * L + c2 * L**2)`` (``packed_cost``), and the same coefficients
balance it.

Kernels get the model as two integers, ``coefficients`` (the one encoding
of the formula for kernels), and compute ``scale * cost`` in int64
(``scale`` is ``q`` for quadratic_duration, 1 otherwise), so no float ever
decides a plan. What a batch may hold under a model is the ``BatchLimits``
and ``BatchConstraint`` of ``core/constraint.py``.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from .cost_fit import calibrate

INT64_MAX = np.iinfo(np.int64).max
KINDS = ("linear", "quadratic", "quadratic_duration")  # the kinds kernels compute
ALL_KINDS = (*KINDS, "step")  # a step model balances as one of KINDS (``plain``)
COST_FORMAT = "streambatch-cost"
COST_VERSIONS = (1,)  # the format versions ``CostModel.load`` reads


@dataclass(frozen=True, repr=False)
class CostModel:
    """A batch cost model: ``kind`` is one of ``KINDS``; ``q`` (length units,
    >= 1) only for ``quadratic_duration``; ``c0, c1, c2`` (seconds per step,
    per padded token, per B * L**2) only for ``step``. Build with
    ``CostModel.linear()``, ``CostModel.quadratic()``,
    ``CostModel.quadratic_duration(q)``, ``CostModel.step(c0, c1, c2)``,
    ``CostModel.fit(step_fn, ...)`` or ``CostModel.load("cost.json")``."""

    kind: str = "quadratic"
    q: int = 0
    c0: float = 0.0
    c1: float = 0.0
    c2: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ALL_KINDS:
            raise ValueError(f"cost kind must be one of {ALL_KINDS}, got {self.kind!r}")
        if self.kind == "step":
            self._check_step()
            return
        if (self.c0, self.c1, self.c2) != (0.0, 0.0, 0.0):
            raise ValueError(f"c0, c1, c2 only apply to kind='step'; got them with kind={self.kind!r}")
        if self.kind == "quadratic_duration":
            if isinstance(self.q, bool) or not isinstance(self.q, numbers.Integral):
                raise TypeError(
                    f"quadratic_duration's q must be an integer number of length units (e.g. frames), "
                    f"got {self.q!r}; convert seconds with round(q_seconds * frame_rate)"
                )
            if not 1 <= int(self.q) <= 2**62:
                raise ValueError(f"quadratic_duration's q must be in [1, 2**62] length units, got {self.q}")
            object.__setattr__(self, "q", int(self.q))
        elif self.q != 0:
            raise ValueError(f"q only applies to kind='quadratic_duration'; got q={self.q!r} with kind={self.kind!r}")

    def _check_step(self) -> None:
        for name in ("c0", "c1", "c2"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise ValueError(f"step cost {name} must be a finite number of seconds >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.c1 <= 0 and self.c2 <= 0:
            raise ValueError(f"a step cost needs c1 > 0 or c2 > 0 (seconds per token or per B*L^2), got "
                             f"c1={self.c1}, c2={self.c2}; fit it with CostModel.fit or `streambatch calibrate`")
        if self.q != 0:
            raise ValueError("q does not apply to kind='step' (it follows from c1 / c2)")

    @classmethod
    def step(cls, c0: float, c1: float, c2: float) -> CostModel:
        """A measured step: ``c0 + c1 * B * L + c2 * B * L**2`` seconds."""
        return cls("step", 0, c0, c1, c2)

    @property
    def plain(self) -> CostModel:
        """The kernel-computable model ranks are balanced under (itself unless
        ``step``: ``quadratic_duration(round(c1 / c2))``, ``linear`` if
        ``c2 = 0``, ``quadratic`` if ``c1 / c2 < 0.5``)."""
        if self.kind != "step":
            return self
        if self.c2 <= 0:
            return CostModel.linear()
        ratio = self.c1 / self.c2
        if ratio < 0.5:
            return CostModel.quadratic()
        return CostModel.quadratic_duration(int(min(round(ratio), 2**62)))

    @property
    def seconds_per_unit(self) -> float:
        """Seconds per unit of ``plain``'s cost (1.0 for the plain kinds: their unit is their own)."""
        if self.kind != "step":
            return 1.0
        return self.c2 if self.plain.kind == "quadratic" else self.c1

    @property
    def per_step(self) -> float:
        """Seconds every step pays whatever its batches (``c0``; 0 for the plain kinds)."""
        return self.c0

    @classmethod
    def linear(cls) -> CostModel:
        return cls("linear")

    @classmethod
    def quadratic(cls) -> CostModel:
        return cls("quadratic")

    @classmethod
    def quadratic_duration(cls, q: int) -> CostModel:
        return cls("quadratic_duration", q)

    @property
    def coefficients(self) -> tuple[int, int]:
        """(ca, cb) with ``scale * cost = B * L * (ca * L + cb)``: the one
        encoding of the cost formula, what every kernel takes (two numbers
        rather than a kind code: a kernel branching on a code inside its loops
        compiles one copy of each loop per model); ``scaled`` and
        ``check_range`` compute from it too."""
        p = self.plain
        return {"linear": (0, 1), "quadratic": (1, 0), "quadratic_duration": (1, p.q)}[p.kind]

    @property
    def scale(self) -> int:
        """Kernels compute ``scale * cost`` to stay in integers."""
        p = self.plain
        return p.q if p.kind == "quadratic_duration" else 1

    def scaled(self, count: ArrayLike, max_len: ArrayLike) -> np.ndarray:
        """``scale * cost`` of batches, exactly as kernels compute it (int64)."""
        b = np.asarray(count, dtype=np.int64)
        m = np.asarray(max_len, dtype=np.int64)
        ca, cb = self.coefficients
        return b * m * (ca * m + cb)

    def batch_cost(self, count: ArrayLike, max_len: ArrayLike) -> np.ndarray:
        """Cost of batches of ``count`` samples padded to ``max_len`` (float64;
        seconds without the per-step ``c0`` for ``step``)."""
        if self.kind == "step":
            b = np.asarray(count, dtype=np.float64)
            m = np.asarray(max_len, dtype=np.float64)
            return b * m * (self.c1 + self.c2 * m)
        return self.scaled(count, max_len) / float(self.scale)

    def packed_cost(self, lengths: ArrayLike, offsets: ArrayLike | None = None) -> np.ndarray:
        """Cost of packed (padding-free) batches: a batch whose samples are
        concatenated, with attention restricted to each sample (varlen), costs
        the sum of what its samples cost alone, ``sum(c1 * L + c2 * L**2)``
        (the plain kinds: ``sum(L)``, ``sum(L**2)``, ``sum(L + L**2 / q)``).

        lengths: (n,) lengths grouped by batch; offsets: (nb + 1,) int64
        batch bounds (batch b is ``lengths[offsets[b]:offsets[b + 1]]``; None:
        one batch). Returns (nb,) float64 (seconds without ``c0`` for ``step``).
        """
        per_sample = self.batch_cost(1, np.asarray(lengths, dtype=np.int64))
        run = np.concatenate([[0.0], np.cumsum(np.atleast_1d(per_sample))])
        if offsets is None:
            return run[-1:].copy()
        off = np.asarray(offsets, dtype=np.int64)
        return run[off[1:]] - run[off[:-1]]

    def packed_scaled(self, lengths: ArrayLike) -> np.ndarray:
        """(n,) int64 ``scale * cost`` of each sample alone, as the packed
        kernels compute it (a packed batch's is their sum)."""
        return self.scaled(1, lengths)

    def epoch_time(self, step_costs: ArrayLike) -> float:
        """``sum over steps of (per_step + the step's costliest batch)`` from
        ``step_costs``: (S, W) float64 batch costs (``batch_cost``)."""
        c = np.asarray(step_costs, dtype=np.float64)
        if c.size == 0:
            return 0.0
        return float(c.reshape(c.shape[0], -1).max(axis=1).sum() + self.per_step * c.shape[0])

    # -------------------------------------------------------- a measured model on disk

    def to_dict(self) -> dict:
        out: dict = {"format": COST_FORMAT, "version": 1, "kind": self.kind}
        if self.kind == "step":
            out.update(c0=self.c0, c1=self.c1, c2=self.c2, units="seconds; L in the planner's length units")
        elif self.kind == "quadratic_duration":
            out["q"] = self.q
        return out

    @classmethod
    def from_dict(cls, d: dict, where: str = "cost") -> CostModel:
        if not isinstance(d, dict) or d.get("format") != COST_FORMAT:
            raise ValueError(f"{where} is not a streambatch cost model (want a JSON object with "
                             f"format={COST_FORMAT!r}, as `streambatch calibrate` writes)")
        version = d.get("version")
        if type(version) is not int or version not in COST_VERSIONS:
            # a newer format may mean other fields or units: planning with a partial reading of it is wrong
            raise ValueError(f"{where} is a {COST_FORMAT!r} file of version {version!r}; this streambatch reads "
                             f"version(s) {list(COST_VERSIONS)}: upgrade streambatch, or measure the model again "
                             "with this one's `streambatch calibrate`")
        kind = d.get("kind")
        if kind == "step":
            return cls.step(d.get("c0"), d.get("c1"), d.get("c2"))
        if kind == "quadratic_duration":
            return cls.quadratic_duration(d.get("q"))
        return cls(kind)

    def save(self, path: str | os.PathLike, fit: dict | None = None) -> None:
        """Write the model (and what its fit measured) as JSON."""
        d = self.to_dict()
        if fit is not None:
            d["fit"] = fit
        with open(path, "w") as f:
            json.dump(d, f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostModel:
        """A model written by ``save`` / ``streambatch calibrate``."""
        try:
            with open(path) as f:
                d = json.load(f)
        except OSError as exc:
            raise ValueError(f"cannot read the cost model {os.fspath(path)!r}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{os.fspath(path)!r} is not JSON ({exc}); pass a file `streambatch calibrate` "
                             "wrote") from None
        return cls.from_dict(d, repr(os.fspath(path)))

    @classmethod
    def fit(cls, step_fn, shapes=None, **options) -> CostModel:
        """Time ``step_fn(batch_size, length)`` (one forward + backward +
        optimizer step of the user's model on a batch of that shape) over a
        designed set of shapes and fit ``c0, c1, c2`` (non-negative least
        squares on relative errors). ``options``: see ``cost_fit.calibrate``
        (max_batch_tokens, max_length, repeats, warmup, max_seconds, progress).
        The fit's report is on the returned model's ``fit_report`` attribute."""
        (c0, c1, c2), report = calibrate(step_fn, shapes=shapes, **options)
        model = cls.step(c0, c1, c2)
        object.__setattr__(model, "fit_report", report)
        return model

    def cost_cap(self, max_step_cost: float | None) -> int:
        """``max_step_cost`` (cost units; None: no cap) as the kernels' cap on
        scaled batch costs (``scale * cost``); a ValueError when no batch fits."""
        if max_step_cost is None:
            return INT64_MAX
        cap = int(min(np.floor(max_step_cost / self.seconds_per_unit * self.scale), INT64_MAX))
        if cap < 1:
            raise ValueError(f"max_step_cost={max_step_cost} is below the cost of any batch ({self}); raise it")
        return cap

    def budget(self, max_len: int, max_tokens: int, max_size: int, world_size: int) -> int:
        """The token budget a planner works with, checked: ``clamp_budget`` then ``check_range``."""
        tokens = clamp_budget(max_tokens, max_size, max_len)
        self.check_range(max_len, tokens, max_size, world_size)
        return tokens

    def check_range(self, max_len: int, max_tokens: int, max_size: int, world_size: int) -> None:
        """Refuse lengths whose scaled costs summed over a step could overflow int64."""
        # A feasible batch holds <= min(budget, size cap * L) tokens, and a lone sample may exceed the budget.
        tokens = max(max_len, min(max_tokens, max_size * max_len))
        ca, cb = self.coefficients
        bound = world_size * tokens * (ca * max_len + cb)  # a step's scaled cost per token, at most
        if bound > INT64_MAX // 4:
            raise ValueError(
                f"lengths up to {max_len} with max_batch_tokens={max_tokens}, max_batch_size={max_size}, "
                f"world_size={world_size} and cost {self} give step costs up to ~{bound:.3g}, beyond int64; "
                "express lengths in coarser units (e.g. frames instead of audio samples)"
            )

    def __repr__(self) -> str:
        # the plain kinds keep the repr they always had: it is part of saved configuration fingerprints
        if self.kind == "step":
            return f"CostModel(kind='step', c0={self.c0!r}, c1={self.c1!r}, c2={self.c2!r})"
        return f"CostModel(kind={self.kind!r}, q={self.q!r})"

    def __str__(self) -> str:
        if self.kind == "step":
            return f"{self.c0:.4g} + {self.c1:.4g}*B*L + {self.c2:.4g}*B*L^2 s"
        return {"linear": "B*L", "quadratic": "B*L^2", "quadratic_duration": f"B*(L+L^2/{self.q})"}[self.kind]


def clamp_budget(max_batch_tokens: int, max_batch_size: int, max_len: int) -> int:
    """The budget clamped to what a batch can hold: ``max_batch_size`` samples of
    at most ``max_len`` (read as 1 when every length is 0) tokens, + 1. A larger
    budget never binds; the clamp keeps kernel arithmetic small. The one copy of
    this rule (``BatchLimits.bind``, for every planner)."""
    return min(max_batch_tokens, max_batch_size * max(max_len, 1) + 1)


def resolve_cost(cost: str | os.PathLike | CostModel | None) -> CostModel:
    """A CostModel from ``None`` (the seed's quadratic), a kind name, a JSON
    file of a fitted model (``"cost.json"``) or a CostModel."""
    if cost is None:
        return CostModel.quadratic()
    if isinstance(cost, CostModel):
        return cost
    if isinstance(cost, os.PathLike) or (isinstance(cost, str) and cost.endswith(".json")):
        return CostModel.load(cost)
    if isinstance(cost, str):
        if cost == "step":
            raise ValueError("cost='step' needs measured coefficients: pass cost='cost.json' (from `streambatch "
                             "calibrate`) or CostModel.step(c0, c1, c2)")
        if cost == "quadratic_duration":
            raise ValueError("cost='quadratic_duration' needs q: pass cost=CostModel.quadratic_duration(q)")
        if cost not in KINDS:
            raise ValueError(f"cost must be one of {KINDS}, a cost JSON file or a CostModel, got {cost!r}")
        return CostModel(cost)
    raise TypeError(f"cost must be a CostModel or one of {KINDS}, got {cost!r} ({type(cost).__name__})")
