"""Plan-quality metrics of an epoch's batches (pure numpy), used the same
way by ``streambatch plan``, ``streambatch demo`` and the benchmarks:

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.plan import Plan


@dataclass(frozen=True)
class Batches:
    """Per-batch statistics of one epoch, each (n_steps, W) int64 in training order.

    sizes: samples per batch (B); longest: longest length in the batch (L),
    0 for an empty batch; real: sum of the batch's lengths.
    """

    sizes: np.ndarray
    longest: np.ndarray
    real: np.ndarray
    # Packed batches (``pack=True``): no padding, a batch costs sum(L**2) and holds sum(L) tokens.
    # sumsq: (n_steps, W) float64 sum of the batch's squared lengths, only for packed batches.
    packed: bool = False
    sumsq: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def world_size(self) -> int:
        return int(self.sizes.shape[1])

    def costs(self) -> np.ndarray:
        """(n_steps, W) float64 B * L**2, or sum(L**2) for packed batches (float: no overflow on long
        lengths)."""
        if self.packed and self.sumsq is not None:
            return self.sumsq
        return self.sizes * self.longest.astype(np.float64) ** 2

    def tokens(self) -> np.ndarray:
        """(n_steps, W) int64 tokens a batch occupies: B * L padded, sum(L) packed."""
        return self.real if self.packed else self.sizes * self.longest


def plan_batches(plan: Plan, lengths: np.ndarray, packed: bool = False) -> Batches:
    """Batch statistics of ``plan`` over ``lengths`` ((N,) int, the lengths planned); ``packed``: the
    plan's batches are packed (``pack=True``), so they hold sum(L) tokens and cost sum(L**2)."""
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
    sumsq = None
    if packed:
        sumsq = np.zeros(sizes.shape[0], dtype=np.float64)
        if full.size:
            sumsq[full] = np.add.reduceat(lens.astype(np.float64) ** 2, offsets[full])
        sumsq = sumsq.reshape(-1, w)[order]
    return Batches(sizes.reshape(-1, w)[order], longest.reshape(-1, w)[order], real.reshape(-1, w)[order],
                   packed, sumsq)


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
    packed: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def quality(b: Batches, max_batch_tokens: int) -> Quality:
    """Metrics of batches ``b`` planned with ``max_batch_tokens`` (packed batches: no padding, budget
    use and over budget by sum(L), costs sum(L**2))."""
    tokens = b.tokens()
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
                   spread, int((tokens > max_batch_tokens).sum()), epoch, time_balance, b.packed)


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


def mix_shares(plan: Plan, mix: Any) -> tuple[np.ndarray, np.ndarray]:
    """(S,) share of each source among the samples a mixed plan trains on
    (padding included), over the epoch and over its first 10 % of steps.
    The plan's samples index the sources' concatenated lengths."""
    from ..epoch.interleave import step_counts

    labels = mix.source_of(np.arange(sum(mix.sizes)))
    counts = step_counts(plan, labels, mix.num_sources)[plan.step_order]
    whole = counts.sum(axis=0)
    early = counts[: max(1, int(round(0.1 * counts.shape[0])))].sum(axis=0)
    return whole / max(whole.sum(), 1), early / max(early.sum(), 1)


def time_report(b: Batches, lengths: np.ndarray, cost: Any, max_batch_tokens: int) -> dict[str, Any]:
    """What an epoch costs in seconds under a measured step model
    (``CostModel.step``): the predicted epoch time ``sum over steps of (c0 +
    the step's costliest batch)``, a lower bound no plan beats, and the parts
    worth looking at: the per-step term, steps whose costliest batch is a
    single sample, the final step, the slowest 1 % of steps."""
    steps = b.num_steps
    if not steps:
        per = np.zeros((0, b.world_size))
    elif b.packed and b.sumsq is not None:  # packed: sum over samples of (c1 * L + c2 * L**2)
        per = cost.c1 * b.real + cost.c2 * b.sumsq
    else:
        per = cost.batch_cost(b.sizes, b.longest)
    top = per.max(axis=1) if steps else np.zeros(0)
    epoch = cost.epoch_time(per)
    lens = np.asarray(lengths, dtype=np.float64)
    # every sample costs at least its own batch of one; a step holds at most W * budget tokens
    work = float(np.sum(lens * (cost.c1 + cost.c2 * lens))) / b.world_size
    min_steps = int(np.ceil(lens.sum() / (b.world_size * max_batch_tokens))) if lens.size else 0
    longest_alone = float(cost.batch_cost(1, lens.max())) if lens.size else 0.0
    bound = cost.c0 * min_steps + max(work, longest_alone)
    lone = np.take_along_axis(b.sizes, per.argmax(axis=1)[:, None], axis=1)[:, 0] == 1 if steps else np.zeros(0, bool)
    k = max(1, steps // 100)
    slow = np.sort(top)[-k:] if steps else np.zeros(0)
    return {"epoch_seconds": epoch, "bound_seconds": bound, "steps": steps, "min_steps": min_steps,
            "per_step_seconds": cost.c0 * steps, "lone_sample_steps": int(lone.sum()),
            "lone_sample_seconds": float(top[lone].sum() + cost.c0 * lone.sum()) if steps else 0.0,
            "final_step_seconds": float(top[-1] + cost.c0) if steps else 0.0,
            "slowest_1pct_seconds": float(slow.sum() + cost.c0 * slow.size)}


def format_time_report(t: dict[str, Any]) -> list[str]:
    e = t["epoch_seconds"] or 1.0
    return [
        f"  predicted epoch      {t['epoch_seconds']:.4g} s   sum over steps of (c0 + costliest batch), "
        f"fitted model",
        f"  time bound           {t['bound_seconds']:.4g} s   no plan is faster (this one: "
        f"{t['epoch_seconds'] / t['bound_seconds'] if t['bound_seconds'] else 1:.2f}x)",
        f"  steps                {t['steps']:,} (the budget needs at least {t['min_steps']:,}); per-step c0: "
        f"{t['per_step_seconds']:.4g} s ({t['per_step_seconds'] / e:.1%})",
        f"  one-sample steps     {t['lone_sample_steps']:,} whose costliest batch is one sample: "
        f"{t['lone_sample_seconds']:.4g} s ({t['lone_sample_seconds'] / e:.1%})",
        f"  slowest 1% of steps  {t['slowest_1pct_seconds']:.4g} s ({t['slowest_1pct_seconds'] / e:.1%}); "
        f"final step {t['final_step_seconds']:.4g} s",
    ]
