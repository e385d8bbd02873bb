"""The batch rule (``core/constraint.py``): checked once per configuration, bound once per plan, the one answer
to "does this batch fit"; and the planner's options resolved once, whatever the glue plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import DynamicBatchSampler, make_plan
from streambatch.core.config import PlanConfig
from streambatch.core.constraint import BatchLimits
from streambatch.core.cost import INT64_MAX, CostModel, clamp_budget
from streambatch.planners import PLANNERS
from streambatch.planners.base import Planner
from tests.support.helpers import examples, lognormal_lengths


def test_bind_clamps_and_range_checks_once():
    lengths = np.array([3, 90, 40], dtype=np.int64)
    c = BatchLimits(10**9, 64).bind(lengths, 4)
    assert (c.max_len, c.max_size, c.max_tokens) == (90, 3, clamp_budget(10**9, 3, 90))
    assert c.max_cost == INT64_MAX and c.coefficients == (1, 0) and c.world_size == 4
    empty = BatchLimits(500, 8).bind(np.zeros(0, dtype=np.int64), 2)
    assert (empty.max_len, empty.max_size) == (0, 1)  # a cap above N never binds; at least 1
    with pytest.raises(ValueError, match="beyond int64"):
        BatchLimits(10**18, 10**6).bind(np.array([2**40], dtype=np.int64), 64)


def test_the_cost_cap_is_checked_when_the_configuration_is_built():
    limits = PlanConfig.build(4000, 32, planner="bucketed", planner_options={"max_step_cost": 2e5}).limits
    assert limits.max_cost == CostModel.quadratic().cost_cap(2e5) == 200_000
    with pytest.raises(ValueError, match="below the cost of any batch"):
        PlanConfig.build(4000, 32, planner="bucketed", planner_options={"max_step_cost": 0.5})
    assert PlanConfig.build(4000, 32, planner="greedy").limits.max_cost == INT64_MAX


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=12), st.integers(1, 3000), st.integers(1, 10),
       st.booleans(), st.sampled_from([None, 5e4, 3e5]))
def test_fits_is_the_contract_rule(batch, tokens, size, pack, step_cap):
    lengths = np.array(batch, dtype=np.int64)
    cost = CostModel.quadratic()
    limits = BatchLimits(tokens, size, cost, step_cap, pack)
    c = limits.bind(lengths, 2)
    n = len(batch)
    if n == 1:
        assert c.fits(lengths)
        return
    used = sum(batch) if pack else n * max(batch)
    scaled = int(cost.packed_scaled(lengths).sum()) if pack else int(cost.scaled(n, max(batch)))
    cap = cost.cost_cap(step_cap)
    assert c.fits(lengths) == (n <= min(size, n) and used <= c.max_tokens and scaled <= cap)


def test_long_sample_policy():
    limits = BatchLimits(1000, 8, max_length=50)
    assert limits.too_long(np.array([10, 50, 51, 400])).tolist() == [False, False, True, True]
    assert not BatchLimits(1000, 8).too_long(np.array([10**9])).any()


def test_built_in_planners_take_the_constraint():
    for name in ("greedy", "bucketed", "shard_affine"):
        assert PLANNERS[name].takes_constraint and PLANNERS[name].kernels.startswith("streambatch.planners.")


def test_options_are_resolved_once_per_configuration(monkeypatch):
    """A walk of ``cost`` from the glue to a kernel resolves the options once: PlanConfig.build (or, for a copy
    made with dataclasses.replace, on its first use); never per window, per segment or per planner call."""
    calls = []
    real = Planner.resolve

    def counting(self, options):
        calls.append(self.name)
        return real(self, options)

    monkeypatch.setattr(Planner, "resolve", counting)
    lengths = lognormal_lengths(3000)
    make_plan(lengths, 8000, 32, 4, planner="bucketed", cost="linear")
    assert calls == ["bucketed"]
    calls.clear()
    s = DynamicBatchSampler.mixed([lengths[:1000], lengths[1000:]], 8000, 32, weights=[1, 2], rank=0, world_size=4,
                                  planner="bucketed", max_step_cost=3e5, max_length=900)
    for e in range(3):
        s.set_epoch(e)
    state = s.state_dict()
    s.load_state_dict(dict(state, step=2))
    assert calls == ["bucketed"]  # at construction; no epoch, mix draw or resume resolved them again
    resumed = DynamicBatchSampler.mixed([lengths[:1000], lengths[1000:]], 8000, 32, weights=[1, 2], rank=0,
                                        world_size=3, planner="bucketed", max_step_cost=3e5, max_length=900)
    calls.clear()
    resumed.load_state_dict(dict(state, step=3))  # elastic: the epoch replanned as segments at another world
    assert resumed.base_step == 3 and calls == []
    # pooled outliers of a shard-affine plan go to the bucketed planner through the registry: no resolve either
    outliers = lengths.copy()
    outliers[:40] = 7000
    calls.clear()
    make_plan(outliers, 8000, 32, 4, planner="shard_affine", cost="linear")
    assert calls == ["shard_affine"]
