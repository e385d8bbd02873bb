"""The shard-affine planner: the cut of a window into per-rank pieces, and its windows' balance (packed and
padded). The walk kernel is checked in ``test_walk.py``, the holder matching in ``test_holders.py``, the planner
contract in ``tests/planners/test_planner_contract.py``, the epochs it plans in ``tests/epoch/test_shard_loop.py``."""

from __future__ import annotations

import numpy as np

from streambatch.core.constraint import BatchLimits
from streambatch.planners.shard_affine.planner import cut_points, plan_affine_window, water_levels


def test_cut_points_and_water_levels():
    rng = np.random.default_rng(0)
    weights = rng.integers(1, 100, 500)
    for carry in (np.zeros(4, np.int64), np.array([0, 3000, 0, 500]), np.array([0, 10**6, 0, 0])):
        shares = water_levels(carry, int(weights.sum()))
        assert 0 <= weights.sum() - shares.sum() < 4  # all of it, but for rounding down
        level = carry + shares
        assert np.all((shares == 0) | (level == level[shares > 0].max()))  # ranks below the level reach it
        cuts = cut_points(weights, shares)
        assert cuts[0] == 0 and cuts[-1] == weights.size and np.all(np.diff(cuts) >= 0)
        got = np.add.reduceat(np.append(weights, 0), cuts[:-1])[: len(shares)] * (np.diff(cuts) > 0)
        assert np.all(np.abs(got - shares) <= 2 * weights.max())


# ------------------------------------------------------------ epoch invariants


def test_packed_window_balance_and_tail():
    from streambatch import CostModel
    from tests.support.helpers import lognormal_lengths

    lens = lognormal_lengths(24_000, seed=5)
    none = np.zeros(0, np.int64)
    aw = plan_affine_window(none, none, lens, BatchLimits(16_000, 64, pack=True), 8, True, False, False, 1)
    plan = aw.plan
    sizes = np.diff(plan.offsets)
    real = np.add.reduceat(lens[plan.samples], plan.offsets[:-1])
    assert np.all((real <= 16_000) | (sizes == 1))
    padded = sizes * np.maximum.reduceat(lens[plan.samples], plan.offsets[:-1])
    assert np.any((padded > 16_000) & (sizes > 1))  # batches the padded rule would refuse: packing is in use
    cost = CostModel.quadratic().packed_cost(lens[plan.samples], plan.offsets).reshape(-1, 8)
    assert np.mean(cost.sum(1) / (8 * cost.max(1))) >= 0.98
    assert len(aw.leftover) < 8 * 64  # ranks run out together: about one batch left per rank at most


def test_balance_on_audio_like_lengths():
    from tests.support.helpers import lognormal_lengths

    lens = lognormal_lengths(24_000, seed=5)
    none = np.zeros(0, np.int64)
    aw = plan_affine_window(none, none, lens, BatchLimits(16_000, 64), 8, True, False, False, 1)
    plan = aw.plan
    sizes = np.diff(plan.offsets)
    longest = np.maximum.reduceat(lens[plan.samples], plan.offsets[:-1])
    cost = (sizes * longest.astype(float) ** 2).reshape(-1, 8)
    assert np.mean(cost.sum(1) / (8 * cost.max(1))) >= 0.95
    assert len(aw.leftover) < 8 * 64  # ranks run out together: about one batch left per rank at most
