"""What a batch costs: the model planners balance ranks and steps with.

A batch of ``B`` samples padded to ``L`` costs

    linear               B * L                 (tokens: memory, or a conv/RNN model)
    quadratic            B * L**2              (the seed's attention proxy; the default)
    quadratic_duration   B * (L + L**2 / q)    (lhotse's ``quadratic_duration``)

``q`` is in the same units as the lengths (frames or tokens, not seconds:
lhotse's ``quadratic_duration=30`` at 50 frames/s is ``q=1500``). Kernels get
the model as two integers, ``coefficients``, and compute ``scale * cost`` in
int64 (``scale`` is ``q`` for quadratic_duration, 1 otherwise), so no float
ever decides a plan.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

INT64_MAX = np.iinfo(np.int64).max
KINDS = ("linear", "quadratic", "quadratic_duration")


@dataclass(frozen=True)
class CostModel:
    """A batch cost model: ``kind`` is one of ``KINDS``; ``q`` (length units,
    >= 1) only for ``quadratic_duration``. Build with ``CostModel.linear()``,
    ``CostModel.quadratic()`` or ``CostModel.quadratic_duration(q)``."""

    kind: str = "quadratic"
    q: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"cost kind must be one of {KINDS}, got {self.kind!r}")
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
    def code(self) -> int:
        """The integer code of ``kind`` (index in ``KINDS``)."""
        return KINDS.index(self.kind)

    @property
    def coefficients(self) -> tuple[int, int]:
        """(ca, cb) with ``scale * cost = B * L * (ca * L + cb)``: what kernels
        take (two numbers rather than ``code``: a kernel branching on a code
        inside its loops compiles one copy of each loop per model)."""
        return {"linear": (0, 1), "quadratic": (1, 0), "quadratic_duration": (1, self.q)}[self.kind]

    @property
    def scale(self) -> int:
        """Kernels compute ``scale * cost`` to stay in integers."""
        return self.q if self.kind == "quadratic_duration" else 1

    def scaled(self, count: ArrayLike, max_len: ArrayLike) -> np.ndarray:
        """``scale * cost`` of batches, exactly as kernels compute it (int64)."""
        b = np.asarray(count, dtype=np.int64)
        m = np.asarray(max_len, dtype=np.int64)
        if self.kind == "linear":
            return b * m
        if self.kind == "quadratic":
            return b * m * m
        return b * m * (self.q + m)

    def batch_cost(self, count: ArrayLike, max_len: ArrayLike) -> np.ndarray:
        """Cost of batches of ``count`` samples padded to ``max_len`` (float64)."""
        return self.scaled(count, max_len) / float(self.scale)

    def cost_cap(self, max_step_cost: float | None) -> int:
        """``max_step_cost`` (cost units; None: no cap) as the kernels' cap on
        scaled batch costs (``scale * cost``); a ValueError when no batch fits."""
        if max_step_cost is None:
            return INT64_MAX
        cap = int(min(np.floor(max_step_cost * self.scale), INT64_MAX))
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
        per_token = {"linear": 1, "quadratic": max_len, "quadratic_duration": self.q + max_len}[self.kind]
        bound = world_size * tokens * per_token
        if bound > INT64_MAX // 4:
            raise ValueError(
                f"lengths up to {max_len} with max_batch_tokens={max_tokens}, max_batch_size={max_size}, "
                f"world_size={world_size} and cost {self} give step costs up to ~{bound:.3g}, beyond int64; "
                "express lengths in coarser units (e.g. frames instead of audio samples)"
            )

    def __str__(self) -> str:
        return {"linear": "B*L", "quadratic": "B*L^2", "quadratic_duration": f"B*(L+L^2/{self.q})"}[self.kind]


def clamp_budget(max_batch_tokens: int, max_batch_size: int, max_len: int) -> int:
    """The budget clamped to what a batch can hold: ``max_batch_size`` samples of
    at most ``max_len`` (read as 1 when every length is 0) tokens, + 1. A larger
    budget never binds; the clamp keeps kernel arithmetic small. The one copy of
    this rule (make_plan, the bucketed, greedy and shard-affine planners)."""
    return min(max_batch_tokens, max_batch_size * max(max_len, 1) + 1)


def resolve_cost(cost: str | CostModel | None) -> CostModel:
    """A CostModel from ``None`` (the seed's quadratic), a kind name or a CostModel."""
    if cost is None:
        return CostModel.quadratic()
    if isinstance(cost, CostModel):
        return cost
    if isinstance(cost, str):
        if cost == "quadratic_duration":
            raise ValueError("cost='quadratic_duration' needs q: pass cost=CostModel.quadratic_duration(q)")
        if cost not in KINDS:
            raise ValueError(f"cost must be one of {KINDS} or a CostModel, got {cost!r}")
        return CostModel(cost)
    raise TypeError(f"cost must be a CostModel or one of {KINDS}, got {cost!r} ({type(cost).__name__})")
