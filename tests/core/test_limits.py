"""Limit curves (issue 34): lookups, the plan check against a naive twin, the token
budget under a curve, bucket profiles of NeMo and lhotse, files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import make_plan
from streambatch.core.limits import BatchShapes, LimitCurve
from streambatch.core.memory import MemoryModel
from tests.support.helpers import examples


def naive_allowed(upper: list[int], sizes: list[int], L: int) -> int:
    """The curve's rule written out: the first bucket whose bound holds L; none: 0."""
    for u, b in zip(upper, sizes):
        if u >= L:
            return b
    return 0


def test_lookup_is_the_bucket_rule():
    c = LimitCurve.from_table([100, 200, 400], [32, 12, 3])
    for L in (0, 1, 99, 100, 101, 200, 201, 400, 401, 10**6):
        assert c.max_batch_size(L) == naive_allowed([100, 200, 400], [32, 12, 3], L)
    assert c.fits([32, 33, 12, 3, 1], [100, 100, 150, 400, 401]).tolist() == [True, False, True, True, False]
    t = c.table(500)
    assert t.dtype == np.int32 and t.shape == (501,)
    assert t[0] == 32 and t[100] == 32 and t[101] == 12 and t[400] == 3 and t[401] == 0
    assert c.max_length == 400
    back = LimitCurve.from_sizes(c.table(400))
    assert back.upper.tolist() == [100, 200, 400] and back.max_batch.tolist() == [32, 12, 3]


def test_a_curve_never_allows_more_on_longer_padding():
    c = LimitCurve.from_table([10, 20, 30], [5, 8, 2])
    assert c.max_batch.tolist() == [5, 5, 2] and c.meta["made_non_increasing"]


@pytest.mark.parametrize("upper, sizes, words", [
    ([10, 10], [3, 2], "strictly increasing"),
    ([0, 10], [3, 2], ">= 1"),
    ([10, 20], [3], "as many length bounds"),
    ([10, 20], [3, -1], ">= 0"),
    ([10.5, 20], [3, 1], "whole numbers"),
])
def test_bad_curves_say_what_is_wrong(upper, sizes, words):
    with pytest.raises(ValueError, match=words):
        LimitCurve.from_table(upper, sizes)


def naive_check(plan, lengths, curve, packed):
    """(step, rank) of every batch over the curve, by walking the plan batch by batch."""
    over = []
    for s in range(plan.num_steps):
        for r in range(plan.world_size):
            lens = [int(lengths[i]) for i in plan.batch(s, r)]
            L = max(lens)
            b = -(-sum(lens) // max(L, 1)) if packed else len(lens)
            if packed and L == 0:
                b = 1
            if b > naive_allowed(curve.upper.tolist(), curve.max_batch.tolist(), L):
                over.append((s, r))
    return over


@settings(max_examples=examples(150), deadline=None)
@given(st.data())
def test_the_plan_check_reports_exactly_the_batches_over_the_curve(data):
    n = data.draw(st.integers(1, 300))
    lengths = np.array(data.draw(st.lists(st.integers(0, 400), min_size=n, max_size=n)), dtype=np.int64)
    world = data.draw(st.integers(1, 4))
    packed = data.draw(st.booleans())
    planner = "bucketed" if packed else data.draw(st.sampled_from(["greedy", "bucketed"]))
    opts = {"pack": True} if packed else {}
    plan = make_plan(lengths, data.draw(st.integers(1, 3000)), data.draw(st.integers(1, 40)), world_size=world,
                     seed=data.draw(st.integers(0, 99)), planner=planner, **opts)
    k = data.draw(st.integers(1, 6))
    upper = sorted(data.draw(st.sets(st.integers(1, 450), min_size=k, max_size=k)))
    sizes = sorted(data.draw(st.lists(st.integers(0, 50), min_size=k, max_size=k)), reverse=True)
    curve = LimitCurve.from_table(upper, sizes)
    check = curve.check(plan, lengths, packed=packed)
    got = [(int(check.shapes.step[i]), int(check.shapes.rank[i])) for i in check.over]
    assert sorted(got) == sorted(naive_check(plan, lengths, curve, packed))
    assert check.ok == (not got)
    assert len(check.shapes) == plan.num_steps * world


@settings(max_examples=examples(100), deadline=None)
@given(st.data())
def test_plans_under_the_curve_budget_stay_under_the_curve_every_sample_once_equal_steps(data):
    # The planners take the curve as a token budget until their kernels take it as a lookup: the budget that
    # budget_within derives must keep every batch under the curve, with the planner's usual promises.
    m0, m1, m2 = data.draw(st.floats(0, 1e8)), data.draw(st.floats(1e2, 1e4)), data.draw(st.floats(0, 50))
    top = data.draw(st.integers(50, 2000))
    model = MemoryModel(m0, m1, m2)
    curve = model.limit_curve(m0 + data.draw(st.floats(1e6, 1e9)), top)
    if curve.max_length < 1:
        return
    lengths = np.array(data.draw(st.lists(st.integers(1, curve.max_length), min_size=1, max_size=400)), np.int64)
    tokens, at = curve.budget_within(curve.max_length)
    # the budget is the largest: one token more puts a batch at the binding length over the curve
    assert (tokens + 1) // at > curve.max_batch_size(at)
    world = data.draw(st.integers(1, 4))
    planner = data.draw(st.sampled_from(["greedy", "bucketed"]))
    plan = make_plan(lengths, tokens, 10**6, world_size=world, planner=planner, seed=data.draw(st.integers(0, 9)))
    assert curve.check(plan, lengths).ok
    sizes = plan.batch_sizes()
    assert sizes.shape[1] == world and (sizes > 0).all()  # equal steps: every rank a batch in every step
    seen = np.bincount(plan.samples, minlength=lengths.size)
    assert (seen >= 1).all() and seen.sum() == lengths.size + plan.num_padded


def test_batch_shapes_follow_training_order():
    lengths = np.arange(1, 101, dtype=np.int64) * 3
    plan = make_plan(lengths, 600, 8, world_size=3, planner="bucketed", seed=3)
    s = BatchShapes.of_plan(plan, lengths, first_step=10)
    assert s.step[:3].tolist() == [10, 10, 10] and s.rank[:4].tolist() == [0, 1, 2, 0]
    for i in range(len(s)):
        batch = lengths[plan.batch(int(s.step[i]) - 10, int(s.rank[i]))]
        assert (s.count[i], s.max_len[i], s.sum_len[i]) == (batch.size, batch.max(), batch.sum())
        assert s.sum_sq[i] == float((batch.astype(float) ** 2).sum())


def test_curve_files_round_trip_and_bad_ones_are_refused(tmp_path):
    c = MemoryModel(1e8, 1e3, 2.0).limit_curve("1GiB", 800, 0.9)
    c.save(tmp_path / "limits.json")
    back = LimitCurve.load(tmp_path / "limits.json")
    assert back == c and np.array_equal(back.table(), c.table())
    d = json.loads((tmp_path / "limits.json").read_text())
    d["version"] = 2
    (tmp_path / "v2.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="version 2.*upgrade streambatch"):
        LimitCurve.load(tmp_path / "v2.json")
    (tmp_path / "cost.json").write_text(json.dumps({"format": "streambatch-cost", "version": 1, "kind": "linear"}))
    with pytest.raises(ValueError, match="not a streambatch limit curve"):
        LimitCurve.load(tmp_path / "cost.json")
    with pytest.raises(ValueError, match="cannot read"):
        LimitCurve.load(tmp_path / "missing.json")


# ---------------------------------------------------------------- bucket profiles

OOMPTIMIZER_OUTPUT = """\
The profile was created with the following settings:
* using 90.0% of available GPU RAM.
* simulating DDP memory overhead.
* using AMP with dtype=bfloat16.
The final profile is:
\t\x1b[1mbucket_duration_bins=[3.2,5.7,9.1,14.5,20.0,30.0]\x1b[0m
\t\x1b[1mbucket_batch_size=[512,288,176,104,72,44]\x1b[0m
"""

NEMO_CONFIG = """\
model:
  sample_rate: 16000
  train_ds:
    manifest_filepath: train.json
    use_lhotse: true
    use_bucketing: true
    min_duration: 0.1
    max_duration: 30.0
    bucket_duration_bins: [3.2, 5.7, 9.1, 14.5, 20.0, 30.0]
    bucket_batch_size: [512, 288, 176, 104, 72, 44]
"""


@pytest.mark.parametrize("text, suffix", [(OOMPTIMIZER_OUTPUT, ".txt"), (NEMO_CONFIG, ".yaml")])
def test_nemo_profiles_import_in_frames(tmp_path, text, suffix):
    path = tmp_path / f"profile{suffix}"
    path.write_text(text)
    c = LimitCurve.from_profile(path, frames_per_second=100)
    assert c.upper.tolist() == [320, 570, 910, 1450, 2000, 3000]
    assert c.max_batch.tolist() == [512, 288, 176, 104, 72, 44]
    # a clip of exactly 5.7 s (570 frames) is in the 5.7 s bucket, one frame more in the next
    assert c.max_batch_size([570, 571, 3000, 3001]).tolist() == [288, 176, 44, 0]


def test_two_dimensional_nemo_buckets_keep_the_tightest_sub_bucket():
    profile = {"bucket_duration_bins": [[5.0, 30], [5.0, 45], [10.0, 57], [10.0, 71]],
               "bucket_batch_size": [100, 80, 50, 40]}
    c = LimitCurve.from_profile(profile, frames_per_second=50)
    assert c.upper.tolist() == [250, 500] and c.max_batch.tolist() == [80, 40]


def test_lhotse_fixed_bucket_constraint_state_imports():
    state = {"max_seq_len_buckets": [2.0, 4.0, 8.0], "batch_sizes": [64, 32, 8], "current_bucket": None,
             "num_cuts": 0}
    c = LimitCurve.from_profile(state, frames_per_second=10)
    assert c.upper.tolist() == [20, 40, 80] and c.max_batch.tolist() == [64, 32, 8]


def test_duration_budgets_follow_the_budget_rule_per_length():
    # lhotse's DynamicBucketingSampler settings: 200 s per batch, quadratic_duration 15 s, at most 100 cuts
    kwargs = {"duration_bins": [2.0, 5.0, 10.0, 20.0], "max_duration": 200.0, "quadratic_duration": 15.0,
              "max_cuts": 100}
    c = LimitCurve.from_profile(kwargs, frames_per_second=10)
    for L in (1, 5, 19, 20, 50, 133, 200):
        d = L / 10
        assert c.max_batch_size(L) == min(100, int(200.0 / (d + d * d / 15.0) + 1e-9)), L
    assert c.max_length == 200 and c.max_batch_size(201) == 0
    # NeMo's lhotse budget: batch_duration, with max_duration only a clip filter beside it
    nemo = {"train_ds": {"use_lhotse": True, "batch_duration": 100.0, "max_duration": 20.0, "min_duration": 0.5,
                         "bucket_duration_bins": [5.0, 20.0]}}
    c = LimitCurve.from_profile(nemo, frames_per_second=10)
    assert c.max_batch_size(200) == 5 and c.max_batch_size(50) == 20 and c.max_length == 200


@pytest.mark.parametrize("profile, words", [
    ({"bucket_duration_bins": [5.0, 3.0], "bucket_batch_size": [2, 1]}, "sorted ascending"),
    ({"bucket_duration_bins": [5.0, 6.0], "bucket_batch_size": [2]}, "one batch size per bucket"),
    ({"bucket_duration_bins": [5.0, 6.0], "bucket_batch_size": [2, 1.5]}, "whole numbers"),
    ({"lr": 0.1, "train_ds": {"max_duration": 20.0, "min_duration": 0.1}}, "no bucket profile found"),
    ({"bucket_duration_bins": [0.2, 0.5], "bucket_batch_size": [2, 1]}, "frames_per_second"),
])
def test_bad_profiles_say_what_is_wrong(profile, words):
    with pytest.raises(ValueError, match=words):
        LimitCurve.from_profile(profile)


def test_profile_files_that_are_nothing_are_refused(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("key: [unclosed\n")
    with pytest.raises(ValueError, match="neither OOMptimizer output, JSON nor YAML"):
        LimitCurve.from_profile(p)
    with pytest.raises(ValueError, match="cannot read the bucket profile"):
        LimitCurve.from_profile(tmp_path / "none.yaml")
    with pytest.raises(TypeError, match="file path or a dict"):
        LimitCurve.from_profile(3)
