"""Packed plans where the size cap binds (``packed_even.py``): the dealing
kernel against a naive twin, and the plan at the fewest steps where the
step-by-step packer is over the step limit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import make_plan
from streambatch.core.bounds import step_bound, step_limit
from streambatch.planners.bucketed import packed_even
from streambatch.planners.bucketed.packed_even import even_pack
from tests.planners.test_planner_contract import check_plan
from tests.support.helpers import examples


def naive_even(slen: list[int], m: int, tokens: int, cap: int, ca: int, cb: int):
    """``even_pack`` from its docstring: each sample, longest first, to the open batch (fewer than ``cap``
    samples) with the fewest tokens, the lower index on ties; False when it does not fit the budget or no
    batch is open."""
    tok, cnt, cost, bins = [0] * m, [0] * m, [0] * m, []
    for ln in slen:
        open_ = [b for b in range(m) if cnt[b] < cap]
        if not open_:
            return False, bins, tok, cnt, cost
        b = min(open_, key=lambda x: (tok[x], x))
        if tok[b] + ln > tokens:
            return False, bins, tok, cnt, cost
        bins.append(b)
        tok[b] += ln
        cnt[b] += 1
        cost[b] += ln * (ca * ln + cb)
    return True, bins, tok, cnt, cost


@settings(max_examples=examples(300), deadline=None)
@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=80), m=st.integers(1, 12),
       tokens=st.integers(300, 3000), cap=st.integers(1, 12), coef=st.sampled_from([(1, 0), (0, 1), (1, 50)]))
def test_even_pack_matches_naive_twin(lengths, m, tokens, cap, coef):
    slen = np.array(sorted(lengths, reverse=True), dtype=np.int64)
    n = slen.size
    bin_of = np.full(n, -1, dtype=np.int64)
    tok, cnt, cost = (np.zeros(m, dtype=np.int64) for _ in range(3))
    ok = even_pack(slen, np.int64(m), np.int64(tokens), np.int64(cap), np.int64(coef[0]), np.int64(coef[1]),
                   bin_of, tok, cnt, cost)
    want_ok, bins, wtok, wcnt, wcost = naive_even(slen.tolist(), m, tokens, cap, *coef)
    assert bool(ok) == want_ok
    if want_ok:
        assert bin_of.tolist() == bins
        assert (tok.tolist(), cnt.tolist(), cost.tolist()) == (wtok, wcnt, wcost)


def cap_bound_lengths(seed: int = 0) -> tuple[np.ndarray, int]:
    """Log-normal clips of about 250 frames with a few of 3,000-8,000, budget 2.1 x the longest: the mean
    (244) sits just under budget / 64 (248), so nearly every batch must hold 64 samples."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3000, 8000))
    x = np.ceil(np.clip(rng.lognormal(np.log(200), 0.6, n), 30, None)).astype(np.int64)
    x[rng.integers(0, n, 5)] = rng.integers(3000, 8000, 5)
    return x, int(2.1 * x.max())


def test_a_binding_size_cap_plans_the_fewest_steps(monkeypatch):
    lengths, budget = cap_bound_lengths(0)
    bound = step_bound(lengths, budget, 64, 2, False, True)
    p = make_plan(lengths, budget, 64, 2, planner="bucketed", pack=True, seed=0)
    check_plan(p, lengths, budget, 64, 2, False, True)
    assert p.num_steps == bound.steps == 57
    # every batch within the budget and the cap (checked above), and a step's two batches cost alike
    costs = np.array([[int((lengths[b].astype(np.int64) ** 2).sum()) for b in step] for step in
                      ([p.samples[p.offsets[s * 2 + r]: p.offsets[s * 2 + r + 1]] for r in range(2)]
                       for s in range(p.num_steps))])
    assert np.mean(costs.min(axis=1) / costs.max(axis=1)) > 0.9
    # the step-by-step packer alone is over the step limit here (69 steps): the fallback is what meets it
    monkeypatch.setattr(packed_even, "plan_even", lambda *a, **k: None)
    q = make_plan(lengths, budget, 64, 2, planner="bucketed", pack=True, seed=0)
    assert q.num_steps > step_limit(bound.steps)


def test_the_fallback_is_deterministic_and_varies_by_epoch():
    lengths, budget = cap_bound_lengths(5)
    a, b = (make_plan(lengths, budget, 64, 1, planner="bucketed", pack=True, seed=3, epoch=e) for e in (0, 0))
    c = make_plan(lengths, budget, 64, 1, planner="bucketed", pack=True, seed=3, epoch=1)
    assert np.array_equal(a.samples, b.samples) and np.array_equal(a.offsets, b.offsets)
    assert not np.array_equal(a.samples, c.samples)
    assert a.num_steps == c.num_steps == a.fewest_steps
