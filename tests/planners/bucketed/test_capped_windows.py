"""A streamed window planned by the bucketed planner within its share of the epoch's step limit
(``epoch/step_budget.py``'s cap, bound as ``BatchConstraint.step_cap``): the planned epoch it trades for the
steps it saves (``planners/bucketed/step_limit.py``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from streambatch.core.constraint import BatchLimits
from streambatch.core.plan_time import epoch_time
from streambatch.planners.bucketed.planner import plan_bucketed


def heavy_tailed_window(seed: int, long: tuple[int, int] = (1000, 8000)) -> np.ndarray:
    """(n,) int64 log-normal lengths (median ~220) with 3-29 long ones (``long``: their range): a streamed window
    whose balanced walk or layouts take more steps than its cap."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1500, 4000))
    lengths = np.ceil(np.exp(rng.normal(5.4, 0.45, n))).astype(np.int64)
    k = int(rng.integers(3, 30))
    lengths[rng.choice(n, k, replace=False)] = rng.integers(*long, k)
    return lengths


def test_a_window_capped_at_its_fewest_tries_the_fill_under_a_lower_cost_cap():
    # A window capped at its fewest steps (an epoch whose slack earlier windows spent) gets the fill: every batch
    # filled to the budget, so a batch of long samples costs budget x its longest, and the step holding it is
    # the epoch's longest. Measured on this window, W = 4: 1.19x the planned epoch (B*L^2 + the default per-step
    # term) of its uncapped layouts, one step more; the fill under the lowest cost cap that keeps the fewest steps
    # (its long samples spread over more batches of the same steps) plans 1.04x.
    lengths = heavy_tailed_window(2, long=(600, 1800))
    w = 4
    limits = BatchLimits(16_000, 64)
    fewest = limits.fewest_steps(lengths, w, True)
    capped = plan_bucketed(lengths, limits.bind(lengths, w, step_cap=fewest), w, True, True, 2, 0)
    free = plan_bucketed(lengths, dataclasses.replace(limits, step_slack=None).bind(lengths, w), w, True, True, 2, 0)
    assert capped.num_steps == fewest < free.num_steps
    trained = np.concatenate([capped.samples, capped.leftover])
    assert np.array_equal(np.sort(trained), np.arange(lengths.shape[0]))  # every sample once, or carried
    rule = limits.bind(lengths, w)
    c0 = rule.default_step_cost(lengths)
    assert epoch_time(capped, lengths, rule.cost, c0) <= 1.05 * epoch_time(free, lengths, rule.cost, c0)
