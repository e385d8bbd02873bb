"""Over-budget samples are announced (issue 32, item 4): one ``LongSampleWarning`` per plan (``make_plan``), per
sampler and per streaming dataset, giving their count, the longest and the fix; and the ``long_samples`` policy
("warn", "drop", "raise") shared by the three entry points, checked once in the batch rule."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from streambatch import DynamicBatchSampler, make_plan
from streambatch.core.config import PlanConfig
from streambatch.core.long_samples import LongSampleWarning
from streambatch.planners.greedy.reference import padded_rank_batches
from streambatch.streaming import StreamingBatches
from tests.planners.test_planner_contract import check_plan
from tests.support.shards import write_lengths

BUDGET = 4_000
# 600 speech-like lengths and 5 over the budget (the longest 9,000)
LENGTHS = np.concatenate([np.random.default_rng(0).integers(50, 900, 600), [4_500, 5_000, 6_000, 7_500, 9_000]])
BIG = np.flatnonzero(LENGTHS > BUDGET)


def recorded(fn):
    """(result, [LongSampleWarning messages]) of ``fn()``, every warning recorded."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in got if issubclass(w.category, LongSampleWarning)]


def says_count_longest_and_fix(text: str) -> None:
    assert "5 sample(s) are longer than max_batch_tokens=4,000 (the longest 9,000)" in text
    assert "Fix: raise max_batch_tokens to at least 9,000" in text


@pytest.mark.parametrize("planner, options", [("greedy", {}), ("bucketed", {}), ("bucketed", {"pack": True}),
                                              ("shard_affine", {})])
def test_make_plan_warns_once_per_plan(planner, options):
    # fails before: make_plan planned them alone, over the budget, and said nothing
    p, said = recorded(lambda: make_plan(LENGTHS, BUDGET, 32, 4, planner=planner, **options))
    assert len(said) == 1  # one per plan, not one per batch
    says_count_longest_and_fix(said[0])
    assert "each is planned alone" in said[0] and "long_samples='drop'" in said[0]
    lone = [p.batch(s, r) for s in range(p.num_steps) for r in range(4)]
    assert sorted({int(b[0]) for b in lone if LENGTHS[b].max() > BUDGET}) == BIG.tolist()  # (padding repeats)
    assert all(b.size == 1 for b in lone if LENGTHS[b].max() > BUDGET)  # alone in their batch, as before
    _, quiet = recorded(lambda: make_plan(LENGTHS[LENGTHS <= BUDGET], BUDGET, 32, 4, planner=planner, **options))
    assert quiet == []  # nothing over the budget: nothing said


@pytest.mark.parametrize("planner, options", [("greedy", {}), ("bucketed", {}), ("bucketed", {"pack": True})])
def test_make_plan_drop_leaves_them_out_counted(planner, options):
    p, said = recorded(lambda: make_plan(LENGTHS, BUDGET, 32, 4, planner=planner, long_samples="drop", **options))
    assert len(said) == 1 and "left out of every plan" in said[0]
    says_count_longest_and_fix(said[0])
    assert p.num_too_long == 5 and p.too_long.tolist() == BIG.tolist()
    planned = set(p.samples.tolist())
    assert not planned & set(BIG.tolist()) and planned == set(range(LENGTHS.size)) - set(BIG.tolist())
    kept = np.delete(LENGTHS, BIG)
    assert max(int(LENGTHS[p.batch(s, r)].max()) for s in range(p.num_steps) for r in range(4)) <= BUDGET
    check_plan(make_plan(kept, BUDGET, 32, 4, planner=planner, **options), kept, BUDGET, 32, 4, False, bool(options))


def test_make_plan_raise_names_count_longest_and_fix():
    with pytest.raises(ValueError) as err:
        make_plan(LENGTHS, BUDGET, 32, 4, long_samples="raise")
    says_count_longest_and_fix(str(err.value))
    make_plan(LENGTHS[LENGTHS <= BUDGET], BUDGET, 32, 4, long_samples="raise")  # nothing over: plans


@pytest.mark.parametrize("entry", ["make_plan", "sampler", "config"])
def test_the_keyword_is_checked_naming_the_values(entry):
    calls = {"make_plan": lambda: make_plan(LENGTHS, BUDGET, long_samples="error"),
             "sampler": lambda: DynamicBatchSampler(LENGTHS, BUDGET, long_samples="skip"),
             "config": lambda: PlanConfig.build(BUDGET, long_samples=None)}
    with pytest.raises(ValueError, match=r"long_samples must be one of \('warn', 'drop', 'raise'\)"):
        calls[entry]()


def test_the_policy_is_in_the_batch_rule_and_the_key_only_where_it_changes_plans():
    warn = PlanConfig.build(BUDGET, 32, 4, planner="bucketed")
    drop = PlanConfig.build(BUDGET, 32, 4, planner="bucketed", long_samples="drop")
    assert warn.limits.long_samples == "warn" and drop.limits.long_samples == "drop"
    assert not warn.limits.too_long(LENGTHS).any() and np.flatnonzero(drop.limits.too_long(LENGTHS)).tolist() == \
        BIG.tolist()
    assert len(warn.key()) == 8  # the key of states saved before the policy existed
    assert "long_samples" not in warn.describe()
    assert warn.fingerprint(LENGTHS) != drop.fingerprint(LENGTHS)
    raised = PlanConfig.build(BUDGET, 32, 4, long_samples="raise")
    assert raised.key() == PlanConfig.build(BUDGET, 32, 4).key()  # refuses, never plans otherwise
    with pytest.raises(TypeError, match="long_samples from the config too"):
        make_plan(LENGTHS, warn, long_samples="drop")
    assert make_plan(LENGTHS, drop).num_too_long == 5  # the config's policy


def test_seed_exact_greedy_stays_the_seed_with_over_budget_samples():
    """The default seed-exact planner: the same batches as the seed sampler (padded), the warning aside."""
    for w in (1, 4):
        sampler, said = recorded(lambda w=w: DynamicBatchSampler(LENGTHS, BUDGET, 32, rank=0, world_size=w))
        assert len(said) == 1
        plan = sampler.plan
        mine = [[plan.rank_batches(r)[i] for i in range(plan.num_steps)] for r in range(w)]
        assert mine == padded_rank_batches(LENGTHS, BUDGET, world_size=w, max_batch_size=32, seed=42, epoch=0)


def test_sampler_warns_once_not_per_epoch_and_drops_on_request(caplog):
    sampler, said = recorded(lambda: DynamicBatchSampler(LENGTHS, BUDGET, 32, rank=0, world_size=4,
                                                         planner="bucketed"))
    assert len(said) == 1 and said[0].startswith("DynamicBatchSampler: ")
    says_count_longest_and_fix(said[0])
    assert "set max_length=4,000 to leave them out" in said[0]
    _, again = recorded(lambda: [sampler.set_epoch(e) or list(sampler) for e in range(3)])
    assert again == []  # not per epoch, not per batch
    drop, said = recorded(lambda: DynamicBatchSampler(LENGTHS, BUDGET, 32, rank=0, world_size=4,
                                                      planner="bucketed", long_samples="drop"))
    assert len(said) == 1 and "left out" in said[0] and drop.num_too_long == 5
    for e in range(2):
        drop.set_epoch(e)
        seen = {i for r in range(4) for b in drop.plan.rank_batches(r) for i in b}
        assert seen == set(range(LENGTHS.size)) - set(BIG.tolist())
    with pytest.raises(ValueError, match=r"5 sample\(s\) are longer than max_batch_tokens=4,000"):
        DynamicBatchSampler(LENGTHS, BUDGET, 32, long_samples="raise")
    # with max_length as well: over max_length left out (as before), over the budget warned
    both, said = recorded(lambda: DynamicBatchSampler(LENGTHS, BUDGET, 32, max_length=7_000))
    assert both.num_too_long == 2 and len(said) == 1 and "3 sample(s) are longer than max_batch_tokens" in said[0]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    return write_lengths(tmp_path_factory.mktemp("long"), LENGTHS, [100] * 6 + [5], prefix="long")


@pytest.mark.parametrize("mode", ["sample", "shard"])
def test_streaming_warns_once_per_dataset(shards, mode):
    """Once per dataset at construction (every rank's process once), not per window or epoch."""
    ds, said = recorded(lambda: StreamingBatches(shards, BUDGET, 32, rank=0, world_size=2, read_mode=mode,
                                                 window_samples=100))
    assert len(said) == 1 and said[0].startswith("StreamingBatches: ")
    says_count_longest_and_fix(said[0])
    _, again = recorded(lambda: [ds.set_epoch(e) or list(ds.plan.windows(e)) for e in range(2)])
    assert again == []
    planned = set()
    for win in ds.plan.windows(0):
        planned |= {int(ds.catalog.lengths(int(s))[int(i)]) for s, i in
                    zip(win.shard_ids[win.plan.samples], win.local[win.plan.samples])}
    assert {4_500, 5_000, 6_000, 7_500, 9_000} <= planned  # planned, alone


@pytest.mark.parametrize("mode", ["sample", "shard"])
def test_streaming_drop_and_raise(shards, mode):
    ds, said = recorded(lambda: StreamingBatches(shards, BUDGET, 32, rank=0, world_size=2, read_mode=mode,
                                                 window_samples=100, long_samples="drop"))
    assert len(said) == 1 and "left out" in said[0]
    assert ds.num_too_long == 5
    seen = set()
    for win in ds.plan.windows(0):
        seen |= {int(ds.catalog.lengths(int(s))[int(i)]) for s, i in
                 zip(win.shard_ids[win.plan.samples], win.local[win.plan.samples])}
    assert max(seen) <= BUDGET
    with pytest.raises(ValueError, match=r"5 sample\(s\) of shard .* are longer than max_batch_tokens=4,000"):
        StreamingBatches(shards, BUDGET, 32, rank=0, world_size=2, read_mode=mode, long_samples="raise")
    with pytest.raises(ValueError, match=r"long_samples must be one of \('warn', 'drop', 'raise'\)"):
        StreamingBatches(shards, BUDGET, 32, rank=0, world_size=2, read_mode=mode, long_samples="error")
