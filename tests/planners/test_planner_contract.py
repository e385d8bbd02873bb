"""The planner contract (``streambatch/planners/base.py``), checked for every
registered planner: a new planner gets the whole contract by being registered.

``check_contract(name)`` is the one check; each property is a hypothesis test
over lengths, budgets, caps, world sizes, flags, seeds and epochs.

A planner registered from your own code gets the same tests: name the modules
that register it in ``STREAMBATCH_PLANNER_MODULES`` (comma-separated, importable,
e.g. with ``PYTHONPATH=.``); they are imported before the tests are collected.

    STREAMBATCH_PLANNER_MODULES=my_planner PYTHONPATH=. python -m pytest tests/planners/test_planner_contract.py
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streambatch import make_plan
from streambatch.planners import PLANNERS, Planner, UnknownOptionError, register_planner
from tests.support.helpers import examples

for _module in filter(None, (m.strip() for m in os.environ.get("STREAMBATCH_PLANNER_MODULES", "").split(","))):
    importlib.import_module(_module)  # registers its planners, which the tests below are parametrized over
NAMES = sorted(PLANNERS)
# Every registered planner, and each that packs (``Planner.packs``) once more with its ``pack`` option on: the
# packed budget rule (sum of lengths) is its own contract, checked by the same tests.
CONFIGS = [(n, {}) for n in NAMES] + [(n, {"pack": True}) for n in NAMES if "pack" in PLANNERS[n].option_names()]
IDS = [n + ("-packed" if o else "") for n, o in CONFIGS]


def check_plan(p, lengths: np.ndarray, tokens: int, size: int, world: int, drop_last: bool,
               packed: bool = False) -> None:
    """Every promise a single plan makes; ``packed``: the budget counts real
    tokens (sum of lengths) instead of padded ones (count x longest)."""
    n = lengths.size
    sizes = p.batch_sizes()
    assert sizes.shape == (p.num_steps, world)
    # equal steps: every rank has a non-empty batch in every step
    assert (sizes > 0).all()
    assert sorted(p.step_order.tolist()) == list(range(p.num_steps))
    assert p.offsets[0] == 0 and p.offsets[-1] == p.samples.size
    counts = Counter(p.samples.tolist())
    leftover = p.leftover.tolist() if p.leftover is not None else []
    # exactly once, except the counted padding or the returned leftover
    assert p.num_dropped == len(leftover)
    assert sum(c - 1 for c in counts.values()) == p.num_padded
    if drop_last:
        assert p.num_padded == 0
        assert not set(leftover) & set(counts), "a leftover sample was also planned"
        assert sorted(leftover + list(counts)) == list(range(n)), "samples lost: drop_last must return them as leftover"
    else:
        assert p.num_dropped == 0 and set(counts) == set(range(n))
    # budget and cap, except a lone oversized sample
    for s in range(p.num_steps):
        for r in range(world):
            b = p.batch(s, r)
            if b.size > 1:
                assert b.size <= size
                used = int(lengths[b].sum()) if packed else b.size * int(lengths[b].max())
                assert used <= tokens, f"step {s} rank {r}: {used} tokens over the budget {tokens}"


lengths_st = st.lists(st.integers(0, 400), max_size=300).map(lambda x: np.array(x, dtype=np.int64))


@pytest.mark.parametrize("name, options", CONFIGS, ids=IDS)
@settings(max_examples=examples(150), deadline=None)
# every length 0 on 2 ranks: steps whose batches all cost 0 (the shard-affine relaxation divided by the costliest)
@example(lengths=np.zeros(1, dtype=np.int64), tokens=1, size=1, world=2, shuffle=False, drop_last=False, seed=0,
         epoch=0)
@given(lengths=lengths_st, tokens=st.integers(1, 3000), size=st.integers(1, 70), world=st.integers(1, 9),
       shuffle=st.booleans(), drop_last=st.booleans(), seed=st.integers(-2**40, 2**40), epoch=st.integers(0, 5))
def test_contract(name, options, lengths, tokens, size, world, shuffle, drop_last, seed, epoch):
    kw = dict(max_batch_tokens=tokens, max_batch_size=size, world_size=world, shuffle=shuffle,
              drop_last=drop_last, seed=seed, epoch=epoch, planner=name, **options)
    p = make_plan(lengths, **kw)
    packed = PLANNERS[name].packs(PLANNERS[name].resolve(options))
    assert packed == bool(options)
    check_plan(p, lengths, tokens, size, world, drop_last, packed)
    # a pure function of its input: the same plan again, with a stable fingerprint
    q = make_plan(lengths.copy(), **kw)
    assert np.array_equal(p.samples, q.samples) and np.array_equal(p.offsets, q.offsets)
    assert np.array_equal(p.step_order, q.step_order)
    assert p.fingerprint() == q.fingerprint() == pickle.loads(pickle.dumps(p)).fingerprint()


@pytest.mark.parametrize("name, options", CONFIGS, ids=IDS)
def test_epochs_and_seeds_differ(name, options):
    lengths = np.random.default_rng(0).integers(20, 800, 3000)
    kw = dict(max_batch_tokens=4000, max_batch_size=32, world_size=4, planner=name, **options)
    plans = [make_plan(lengths, seed=s, epoch=e, **kw) for s, e in ((1, 0), (1, 1), (3, 0))]
    prints = {p.fingerprint() for p in plans}
    # (the seed-exact planner seeds with seed + epoch, as the seed does: (1, 1) and (2, 0) coincide there)
    assert len(prints) == 3, "other epochs and seeds must give other plans"
    fixed = [make_plan(lengths, shuffle=False, seed=s, epoch=e, **kw).fingerprint() for s, e in ((1, 0), (2, 3))]
    assert fixed[0] == fixed[1], "without shuffling, seed and epoch must not matter"


@pytest.mark.parametrize("name, options", CONFIGS, ids=IDS)
def test_streaming_leftover_rule(name, options):
    """With drop_last, what is not planned comes back as leftover; planning the
    leftover with the next window's samples loses nothing (what streaming does)."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 1000, 5000)
    seen: list[int] = []
    carry = np.zeros(0, dtype=np.int64)
    for w, window in enumerate(np.array_split(np.arange(lengths.size), 4)):
        ids = np.concatenate([carry, window])
        last = w == 3
        p = make_plan(lengths[ids], 6000, 24, 8, drop_last=not last, seed=w, planner=name, **options)
        check_plan(p, lengths[ids], 6000, 24, 8, not last, bool(options))
        seen += ids[np.unique(p.samples)].tolist()
        carry = ids[p.leftover] if not last else carry[:0]
    assert sorted(seen) == list(range(lengths.size))


@pytest.mark.parametrize("name", NAMES)
def test_options_are_declared_and_checked(name):
    planner = PLANNERS[name]
    assert isinstance(planner, Planner) and planner.options is not None
    with pytest.raises(UnknownOptionError, match=rf"{name}.*no_such_option"):
        make_plan([1, 2, 3], 100, planner=name, no_such_option=1)
    resolved = planner.resolve({})
    assert resolved == {o.name: o.default for o in planner.options}
    assert planner.cost_model(resolved).kind in planner.costs


def test_the_greedy_option_typo_names_its_options():
    with pytest.raises(ValueError, match=r"planner 'greedy' got unknown option\(s\) \['bucket_width'\]; it takes no"):
        make_plan([1, 2, 3], 100, bucket_width=0.1)


def test_linear_cost_is_guarded_by_its_own_formula():
    # lengths near 2**33 with budget 2**36: fine for B*L, beyond int64 for B*L**2
    lengths = np.random.default_rng(0).integers(1, 2**33, 500)
    p = make_plan(lengths, 2**36, 8, 2, planner="bucketed", cost="linear")
    check_plan(p, lengths, 2**36, 8, 2, False)
    with pytest.raises(ValueError, match="beyond int64"):
        make_plan(lengths, 2**36, 8, 2, planner="bucketed")


def test_a_new_planner_is_one_registration():
    """A planner that drops its tail with drop_last but forgets leftover fails the contract."""

    def lossy(lengths, tokens, size, world, shuffle, drop_last, seed, epoch):
        p = PLANNERS["greedy"](lengths, tokens, size, world, shuffle, drop_last, seed, epoch)
        if p.leftover is not None and p.leftover.size:
            from dataclasses import replace
            return replace(p, leftover=p.leftover[:0], num_dropped=0)
        return p

    register_planner(Planner("lossy-test", lossy))
    try:
        lengths = np.full(10, 10)  # 8 ranks, one sample each: the second step is partial
        p = make_plan(lengths, 100, 1, 8, drop_last=True, planner="lossy-test")
        with pytest.raises(AssertionError, match="samples lost"):
            check_plan(p, lengths, 100, 1, 8, True)
    finally:
        del PLANNERS["lossy-test"]
