"""Packed (padding-free) planning, ``make_plan(..., planner="bucketed", pack=True)``:
the step kernel against a naive twin, the packed budget rule under every cost
model and cap, balance under the packed cost, and the option's checks. The
planner contract (exactly once, equal steps, leftover, determinism) is checked
for the packed mode in ``test_planner_contract.py``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import CostModel, make_plan
from streambatch.core.constraint import NO_TABLE
from streambatch.epoch.elastic import plan_segments, step_samples
from streambatch.planners import UnknownOptionError
from streambatch.planners.bucketed.packed import rotate_ranks
from streambatch.planners.bucketed.packed_steps import pack_plan
from streambatch.planners.bucketed.planner import bucket_edges
from streambatch.planners.bucketed.sort import table_size
from tests.support.helpers import examples, lognormal_lengths

I64_MAX = np.iinfo(np.int64).max

# ------------------------------------------------------------ the step kernel


def naive_pack(lengths: list[int], edges: list[int], w: int, tokens: int, cap: int, ca: int, cb: int,
               max_cost: int, spread: bool, curve=None):
    """``pack_plan`` without shuffling, from its specification, with lists and linear scans. curve: a
    ``LimitCurve``: a bin whose longest is L holds at most ``min(tokens, max(1, min(cap, curve(L))) * L)``
    tokens, and a sample longer than the bin's longest that would break that closes the bin."""

    def tokens_at(longest: int) -> int:
        return tokens if curve is None else min(tokens, max(1, min(cap, int(curve.max_batch_size(longest))))
                                                * longest)

    def cost(ln: int) -> int:
        return ln * (ca * ln + cb)

    def bucket(ln: int) -> int:
        return sum(e <= ln for e in edges)

    def longest_fitting(full: list[int], room: int) -> int | None:
        """The longest nonempty bucket whose next sample fits room (the kernel's ``_fitting``)."""
        rb = bucket(room)
        below = [x for x in full if x <= rb]
        if below and below[-1] == rb and lengths[queues[rb][0]] > room:
            # the straddling bucket: the first of its next 8 samples that fits comes to the front, else none
            q = queues[rb]
            hit = next((i for i in range(1, min(8, len(q))) if lengths[q[i]] <= room), None)
            if hit is not None:
                q[0], q[hit] = q[hit], q[0]
                return rb
            below.pop()  # the buckets below all fit
        return below[-1] if below else None

    n = len(lengths)
    queues: dict[int, list[int]] = {}
    for i in sorted(range(n), key=lambda i: (bucket(lengths[i]), i)):
        queues.setdefault(bucket(lengths[i]), []).append(i)
    left_tokens, remaining = sum(lengths), n
    out, counts, complete = [], [], True
    while remaining:
        bins: list[list[int]] = [[] for _ in range(w)]
        c, t, shut = [0] * w, [0] * w, [False] * w
        while not all(shut) and remaining:
            b = min((r for r in range(w) if not shut[r]), key=lambda r: (c[r], t[r], len(bins[r]), r))
            full = [q for q in sorted(queues) if queues[q]]
            if not bins[b]:
                q = full[-1]  # an empty bin takes the next sample of the longest bucket, whatever its length
            else:
                room = tokens_at(max(lengths[i] for i in bins[b])) - t[b]  # the longest within the token room
                if max_cost < I64_MAX:
                    room = max([x for x in range(0, room + 1) if cost(x) <= max_cost - c[b]], default=-1)
                q = None
                if len(bins[b]) < cap and room >= 0:
                    # mean tracking: the bin's samples longer on average than those left: at most room per
                    # target slot, the target a bin of the mean length left holds (at most the size cap)
                    c_, rem, lt = len(bins[b]), float(remaining), float(left_tokens)
                    if spread and cap - c_ > 1:
                        if tokens * rem >= cap * lt:  # count-bound: room kept for the other slots at the shortest
                            keep = room - (cap - c_ - 1) * lengths[queues[full[0]][0]]
                            if keep >= 0:
                                q = longest_fitting(full, keep)
                        elif room * rem < (cap - c_) * lt and t[b] * rem > c_ * lt and tokens * rem > (c_ + 1) * lt:
                            q = longest_fitting(full, int(room / min(float(cap - c_), tokens * rem / lt - c_)))
                    if q is None:
                        q = longest_fitting(full, room)
                    if curve is not None and q is not None:
                        nl, mx = lengths[queues[q][0]], max(lengths[i] for i in bins[b])
                        if nl > mx and t[b] + nl > tokens_at(nl):
                            q = None
                if q is None:
                    shut[b] = True
                    continue
            j = queues[q].pop(0)
            bins[b].append(j)
            c[b] += cost(lengths[j])
            t[b] += lengths[j]
            left_tokens -= lengths[j]
            remaining -= 1
        if not remaining and not all(shut):
            complete = False
        counts.append([len(x) for x in bins])
        out += [i for x in bins for i in x]
    return out, counts, complete


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(0, 120), min_size=1, max_size=60), st.integers(1, 5), st.integers(1, 400),
       st.integers(1, 12), st.sampled_from([(1, 0), (0, 1), (1, 30)]), st.one_of(st.none(), st.integers(1, 60_000)),
       st.floats(0.001, 1), st.floats(0, 1), st.booleans())
def test_kernel_matches_naive_twin(lengths, w, tokens, cap, coef, max_cost, width, phase, spread):
    lengths = np.array(lengths, dtype=np.int64)
    n = lengths.size
    edges = bucket_edges(int(lengths.max()), width, phase)
    cap_cost = I64_MAX if max_cost is None else max_cost
    table = np.empty(table_size(int(lengths.max()), n), dtype=np.int32)
    out = np.full(n + w, -1, dtype=np.int64)
    scratch = np.empty(n, dtype=np.int64)
    counts, k, complete = pack_plan(lengths, edges, table, np.uint64(7), False, w, tokens, cap, NO_TABLE, *coef,
                                    cap_cost, spread, np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), out,
                                    scratch)
    want, want_counts, want_complete = naive_pack(lengths.tolist(), edges.tolist(), w, tokens, cap, *coef, cap_cost,
                                                  spread)
    assert counts[: k * w].reshape(k, w).tolist() == want_counts
    assert out[:n].tolist() == want
    assert complete == want_complete


def test_rotate_ranks_moves_whole_batches():
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 5, (6, 3))
    samples = np.arange(int(counts.sum()))
    rot = rng.integers(0, 3, 6)
    out, new = rotate_ranks(samples, counts, rot)
    offsets = np.concatenate([[0], np.cumsum(counts.ravel())])
    new_off = np.concatenate([[0], np.cumsum(new.ravel())])
    for s in range(6):
        for j in range(3):
            r = (j + rot[s]) % 3
            b = s * 3 + j
            moved = out[new_off[s * 3 + r] : new_off[s * 3 + r + 1]]
            assert moved.tolist() == samples[offsets[b] : offsets[b + 1]].tolist()


# ------------------------------------------------------------ plans


def packed_costs(plan, lengths, cost):
    """(steps, W) packed cost of every batch, in training order."""
    c = cost.packed_cost(lengths[plan.samples], plan.offsets).reshape(-1, plan.world_size)
    return c[plan.step_order]


COSTS = [CostModel.quadratic(), CostModel.linear(), CostModel.quadratic_duration(40), CostModel.step(0.05, 2e-4, 1e-6)]


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.integers(0, 300), max_size=200).map(lambda x: np.array(x, dtype=np.int64)),
       st.integers(1, 2000), st.integers(1, 40), st.integers(1, 8), st.sampled_from(range(len(COSTS))),
       st.one_of(st.none(), st.floats(1.0, 5.0)), st.booleans(), st.integers(0, 2**40))
def test_packed_budget_and_cost_cap_under_every_cost(lengths, tokens, size, world, which, cap_ratio, drop_last, seed):
    cost = COSTS[which]
    max_step_cost = None
    if cap_ratio is not None and lengths.size:
        # a cap at 1-5x the longest sample's cost alone, in the model's units (below 1 unit: a ValueError, tested)
        max_step_cost = cap_ratio * float(cost.batch_cost(1, max(int(lengths.max()), 1)))
    p = make_plan(lengths, tokens, size, world, drop_last=drop_last, seed=seed, planner="bucketed", pack=True,
                  cost=cost, max_step_cost=max_step_cost)
    sizes = np.diff(p.offsets)
    real = np.add.reduceat(lengths[p.samples], p.offsets[:-1]) if p.samples.size else sizes
    lone = sizes == 1
    assert np.all(lone | ((real <= tokens) & (sizes <= size)))
    if max_step_cost is not None and p.samples.size:
        c = cost.packed_cost(lengths[p.samples], p.offsets)
        assert np.all(lone | (c <= max_step_cost * (1 + 1e-9)))


def test_padding_free_and_balanced_on_audio_like_lengths():
    # a guard on plan quality (the bench reports the figures): steps balanced under the packed cost, and
    # batches that stop short of the budget only when the size cap binds or the data ends
    lengths = lognormal_lengths(20_000, seed=3)
    for w in (8, 64):
        p = make_plan(lengths, 16_000, 64, w, seed=1, planner="bucketed", pack=True)
        c = packed_costs(p, lengths, CostModel.quadratic())
        balance = float(np.mean(c.sum(axis=1) / (w * c.max(axis=1))))
        assert balance >= (0.99 if w == 8 else 0.98), balance
        sizes = np.diff(p.offsets).reshape(-1, w)
        real = np.add.reduceat(lengths[p.samples], p.offsets[:-1]).reshape(-1, w)
        planned = np.sort(p.step_order)  # all but the last planned step: full or at the size cap
        full = (real[planned[:-1]] >= 0.97 * 16_000) | (sizes[planned[:-1]] == 64)
        assert full.mean() >= 0.99
        assert p.num_padded == 0 and np.unique(p.samples).size == lengths.size


def test_a_step_model_balances_its_batch_part():
    # with c0 > 0 the per-step part is the same on every rank; the batches balance under c1 * L + c2 * L^2
    lengths = lognormal_lengths(5000, seed=4)
    cost = CostModel.step(0.02, 3e-5, 1e-8)
    p = make_plan(lengths, 8000, 64, 8, seed=2, planner="bucketed", pack=True, cost=cost)
    c = packed_costs(p, lengths, cost)
    assert np.mean(c.sum(axis=1) / (8 * c.max(axis=1))) >= 0.99
    assert cost.epoch_time(c) == pytest.approx(c.max(axis=1).sum() + 0.02 * p.num_steps)


def test_pack_false_is_the_padded_plan():
    lengths = lognormal_lengths(3000, seed=6)
    for kw in ({}, {"cost": "linear"}):
        a = make_plan(lengths, 8000, 32, 4, seed=3, planner="bucketed", **kw)
        b = make_plan(lengths, 8000, 32, 4, seed=3, planner="bucketed", pack=False, **kw)
        assert a.fingerprint() == b.fingerprint()
    packed = make_plan(lengths, 8000, 32, 4, seed=3, planner="bucketed", pack=True)
    assert packed.fingerprint() != a.fingerprint()


def test_pack_option_checks():
    with pytest.raises(UnknownOptionError, match=r"planner 'greedy'.*\['pack'\].*planner='bucketed', pack=True"):
        make_plan([1, 2, 3], 100, pack=True)
    with pytest.raises(TypeError, match="pack must be True or False"):
        make_plan([1, 2, 3], 100, planner="bucketed", pack="yes")
    with pytest.raises(ValueError, match="below the cost of any batch"):
        make_plan([0, 3], 100, planner="bucketed", pack=True, max_step_cost=0.5)
    p = make_plan([5, 1, 1, 1, 200], 10, 4, 2, planner="bucketed", pack=True, shuffle=False)
    # sum-based: (5, 1, 1, 1) is one batch of 8 tokens; padded it would be 4 x 5 = 20 > 10
    assert sorted(len(p.batch(s, r)) for s in range(p.num_steps) for r in range(2)) == [1, 4]


def test_packed_cost_sums_samples_alone():
    lengths = np.array([3, 10, 7, 0, 25])
    offsets = np.array([0, 2, 2, 5])
    for cost in COSTS:
        want = [sum(float(cost.batch_cost(1, x)) for x in lengths[a:b]) for a, b in zip(offsets, offsets[1:])]
        assert cost.packed_cost(lengths, offsets) == pytest.approx(want)
        assert cost.packed_cost(lengths) == pytest.approx([sum(want)])
        assert cost.packed_scaled(lengths).tolist() == [int(cost.scaled(1, x)) for x in lengths]
    # packed never costs more than padded: sum(L^2) <= B * max(L)^2
    q = CostModel.quadratic()
    assert q.packed_cost(lengths)[0] <= q.batch_cost(5, 25)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(0, 400), st.lists(st.tuples(st.integers(1, 9), st.floats(0, 1)), min_size=1, max_size=3),
       st.integers(1, 9), st.booleans(), st.integers(0, 3))
def test_elastic_segments_train_every_sample_once(n, history, world, drop_last, epoch):
    lengths = lognormal_lengths(400, seed=8)[:n]

    def plan_fn(lens, w, seed, ep):
        return make_plan(lens, 4000, 16, w, drop_last=drop_last, seed=seed, epoch=ep, planner="bucketed", pack=True)

    segments, trained = (), []
    for w, frac in history:
        plan, _ = plan_segments(lengths, plan_fn, w, segments, 5, epoch)
        k = int(frac * plan.num_steps)
        trained.append(step_samples(plan, k))
        segments += ((w, k),) if k else ()
        if k == plan.num_steps:
            return  # this world finished the epoch
    plan, base = plan_segments(lengths, plan_fn, world, segments, 5, epoch)
    assert (plan.batch_sizes() >= 1).all()
    trained.append(step_samples(plan, plan.num_steps))
    counts = np.bincount(np.concatenate(trained).astype(np.int64), minlength=n)
    assert int((counts == 0).sum()) == (plan.num_dropped if drop_last else 0)
    assert int((counts - 1).clip(0).sum()) <= sum(w - 1 for w, _ in segments) + world - 1
    real = np.add.reduceat(lengths[plan.samples], plan.offsets[:-1]) if plan.samples.size else []
    assert all(r <= 4000 or s == 1 for r, s in zip(real, np.diff(plan.offsets)))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(0, 120), min_size=1, max_size=60), st.integers(1, 5), st.integers(1, 400),
       st.integers(1, 12), st.sampled_from([(1, 0), (0, 1), (1, 30)]), st.floats(0.001, 1), st.floats(0, 1),
       st.booleans(), st.lists(st.tuples(st.integers(1, 130), st.integers(0, 12)), min_size=1, max_size=4))
def test_kernel_with_a_limit_curve_matches_naive_twin(lengths, w, tokens, cap, coef, width, phase, spread, points):
    from streambatch.core.limits import LimitCurve

    lengths = np.array(lengths, dtype=np.int64)
    n = lengths.size
    upper = sorted({u for u, _ in points})
    curve = LimitCurve.from_table(upper, [b for _, b in points][: len(upper)])
    lmax = int(lengths.max())
    ttab = np.minimum(tokens, curve.size_table(lmax, cap) * np.arange(lmax + 1))  # BatchConstraint.token_table
    edges = bucket_edges(lmax, width, phase)
    table = np.empty(table_size(lmax, n), dtype=np.int32)
    out = np.full(n + w, -1, dtype=np.int64)
    counts, k, complete = pack_plan(lengths, edges, table, np.uint64(7), False, w, tokens, cap, ttab, *coef,
                                    I64_MAX, spread, np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), out,
                                    np.empty(n, dtype=np.int64))
    want, want_counts, want_complete = naive_pack(lengths.tolist(), edges.tolist(), w, tokens, cap, *coef, I64_MAX,
                                                  spread, curve)
    assert counts[: k * w].reshape(k, w).tolist() == want_counts
    assert out[:n].tolist() == want
    assert complete == want_complete
