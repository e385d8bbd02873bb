"""Weighted mixing: quotas, cycles (every sample once per cycle), determinism,
and the step interleaving kernel against a pure-Python twin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import make_plan
from streambatch.core.mix import Mix, SourceSpec, apportion, specs_from
from streambatch.epoch.in_memory import plan_epoch_steps
from streambatch.epoch.interleave import interleave_steps, step_counts
from streambatch.planners.step_order import deficit_order
from tests.support.helpers import examples, lognormal_lengths


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=6).filter(lambda w: sum(w) > 0), st.integers(0, 10**6))
def test_apportion_sums_and_stays_within_one_sample(weights, total):
    w = np.array(weights)
    c = apportion(total, w)
    assert c.sum() == total and (c >= 0).all()
    assert np.abs(c - w / w.sum() * total).max() < 1 + 1e-6


def test_quotas_from_weights_samples_and_repeats():
    assert Mix.build([100, 30], [SourceSpec(weight=0.6), SourceSpec(weight=0.4)]).counts == (78, 52)
    assert Mix.build([100, 30], specs_from(2, weights=[3, 2]), samples_per_epoch=1000).counts == (600, 400)
    assert Mix.build([100, 30], specs_from(2, repeats=[1, 2.5])).counts == (100, 75)
    assert Mix.build([100, 30], specs_from(2, samples=[10, 300])).counts == (10, 300)
    assert Mix.build([100, 30], [SourceSpec(samples=5), SourceSpec(repeat=2)]).counts == (5, 60)
    assert Mix.build([100, 30]).counts == (100, 30)  # default: each sample once per epoch


@pytest.mark.parametrize("call, match", [
    (lambda: SourceSpec(weight=1, repeat=2), "one of weight, samples or repeat"),
    (lambda: SourceSpec(weight=-1), "weight must be a finite number >= 0"),
    (lambda: SourceSpec(samples=1.5), "samples must be an integer"),
    (lambda: Mix.build([10, 10], [SourceSpec(weight=1), SourceSpec(repeat=1)]), "every source has a weight or none"),
    (lambda: Mix.build([10, 0]), "source 1 holds no samples"),
    (lambda: Mix.build([10, 10], specs_from(2, weights=[0, 0])), "must not all be 0"),
    (lambda: Mix.build([10], specs_from(1, repeats=[2]), samples_per_epoch=5), "samples_per_epoch applies"),
    (lambda: Mix.build([10], specs_from(1, weights=[1]), samples_per_epoch=0), "samples_per_epoch must be"),
    (lambda: specs_from(2, weights=[1, 2], repeats=[1, 1]), "one of weights, samples or repeats"),
    (lambda: specs_from(2, weights=[1]), "one entry per source"),
])
def test_bad_specs_name_the_problem(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 90)), min_size=1, max_size=4).filter(
    lambda s: sum(c for _, c in s) > 0), st.integers(0, 2**40), st.booleans())
def test_every_sample_once_per_cycle(sources, seed, shuffle):
    sizes, counts = [n for n, _ in sources], [c for _, c in sources]
    mix = Mix.build(sizes, specs_from(len(sizes), samples=counts))
    epochs = 6
    draws = [mix.draw(seed, e, shuffle) for e in range(epochs)]
    assert all(d.shape == (mix.samples_per_epoch,) for d in draws)
    off = mix.offsets
    for i, (n, c) in enumerate(zip(sizes, counts)):
        stream = np.concatenate([d[(d >= off[i]) & (d < off[i + 1])] for d in draws]) - off[i]
        assert stream.shape[0] == epochs * c
        for k in range(0, stream.shape[0], n):  # each cycle a permutation (the last possibly partial)
            cycle = stream[k : k + n]
            assert np.unique(cycle).shape[0] == cycle.shape[0]
        for e in range(epochs):  # positions say where the epoch starts in the stream
            cyc, pos = mix.positions(e)[i]
            assert cyc * n + pos == e * c
    assert all((a == b).all() for a, b in zip(draws, [mix.draw(seed, e, shuffle) for e in range(epochs)]))


def test_cycles_reshuffle_and_seeds_differ():
    mix = Mix.build([50, 20], specs_from(2, repeats=[1, 3]))
    d = mix.draw(1, 0)
    b = d[d >= 50] - 50
    assert sorted(b[:20]) == sorted(b[20:40]) == list(range(20)) and (b[:20] != b[20:40]).any()
    assert (mix.draw(2, 0) != d).any() and (mix.draw(1, 1) != d).any()
    assert (Mix.build([5]).draw(0, 0, shuffle=False) == np.arange(5)).all()


def naive_deficit_order(counts, classes, num_classes, order):
    """Pure-Python twin of ``deficit_order``."""
    n, s = counts.shape
    queues = [[int(i) for i in order if classes[i] == c] for c in range(num_classes)]
    totals = counts.sum(axis=0).astype(float)
    share = totals / totals.sum() if totals.sum() > 0 else totals
    err = np.zeros(s)
    out = []
    for _ in range(n):
        best, best_score = None, np.inf
        for c in range(num_classes):
            if queues[c]:
                step = queues[c][0]
                e = err + counts[step] - share * counts[step].sum()
                score = float((e * e).sum())
                if score < best_score:
                    best, best_score = c, score
        step = queues[best].pop(0)
        out.append(step)
        err = err + counts[step] - share * counts[step].sum()
    return out


@settings(max_examples=examples(150), deadline=None)
@given(st.integers(1, 30), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_interleave_kernel_matches_naive_twin(n, s, seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 20, (n, s)).astype(np.int64)
    k = s * 3
    classes = rng.integers(0, k, n).astype(np.int64)
    order = rng.permutation(n).astype(np.int64)
    assert deficit_order(counts, classes, k, order).tolist() == naive_deficit_order(counts, classes, k, order)


@pytest.mark.parametrize("planner", ["greedy", "bucketed"])
def test_interleave_keeps_the_steps_and_spreads_the_sources(planner):
    # two sources of disjoint lengths: every step is pure, so a shuffled
    # order strays by more than a step (1.1-4.5 steps on these seeds)
    a, b = lognormal_lengths(3000, seed=1) // 4 + 10, lognormal_lengths(1500, seed=2) + 2000
    lengths = np.concatenate([a, b])
    labels = (np.arange(lengths.shape[0]) >= a.shape[0]).astype(np.int64)
    plan = make_plan(lengths, 20_000, 32, 4, seed=3, planner=planner)
    mixed = interleave_steps(plan, labels, 2)
    assert sorted(mixed.step_order.tolist()) == list(range(plan.num_steps))
    assert (mixed.samples == plan.samples).all() and (mixed.offsets == plan.offsets).all()
    counts = step_counts(mixed, labels, 2)[mixed.step_order]
    run = np.cumsum(counts, axis=0)
    share = run[:, 1] / run.sum(axis=1)
    target = counts[:, 1].sum() / counts.sum()
    biggest = counts.sum(axis=1).max()
    # every prefix is within half a step of the epoch's share
    assert (np.abs(share - target) * run.sum(axis=1) <= 0.5 * biggest).all()


def test_mixed_epoch_realises_the_quotas_exactly():
    a, b = lognormal_lengths(2000, seed=4), lognormal_lengths(500, seed=5) * 2
    mix = Mix.build([2000, 500], specs_from(2, weights=[0.6, 0.4]))
    lengths = np.concatenate([a, b])

    def fn(lens, w, seed, epoch):
        return make_plan(lens, 8000, 32, w, seed=seed, epoch=epoch, planner="bucketed")

    for e in range(3):
        plan = plan_epoch_steps(lengths, fn, 4, 7, e, mix=mix)[0]
        trained = plan.samples[: plan.offsets[-1]]
        got = np.bincount(mix.source_of(trained), minlength=2) - [0, 0]
        assert abs(got[0] - 1500) + abs(got[1] - 1000) <= plan.num_padded
        assert plan.batch_sizes().min() >= 1


M64 = (1 << 64) - 1


def splitmix(h: int, v: int) -> int:
    """Pure-Python twin of ``core.hashing._mix``."""
    z = ((h ^ v) + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def naive_fisher_yates(n: int, key: int) -> list[int]:
    a = list(range(n))
    for i in range(n - 1):
        j = i + (((splitmix(key, i) >> 32) * (n - i)) >> 32)
        a[i], a[j] = a[j], a[i]
    return a


def naive_feistel(n: int, key: int) -> list[int]:
    bits = max(1, (n - 1).bit_length())
    u, v = bits // 2, bits - bits // 2
    keys = [splitmix(splitmix(key, r), 0x726F756E64) for r in range(6)]
    out = []
    for i in range(n):
        y = i
        while True:
            a, b = y >> v, y & ((1 << v) - 1)
            for r in range(6):
                m = (1 << (u if r % 2 == 0 else v)) - 1
                a, b = b, (a + splitmix(keys[r], b)) & m
            y = (a << v) | b
            if y < n:
                break
        out.append(y)
    return out


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(2, 300), st.integers(0, 2**64 - 1), st.data())
def test_permutation_kernels_match_naive_twins(n, key, data):
    from streambatch.core.shuffle import feistel_range, fisher_yates_range

    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    for kernel, twin in ((fisher_yates_range, naive_fisher_yates), (feistel_range, naive_feistel)):
        out = np.empty(hi - lo, dtype=np.int64)
        kernel(n, np.uint64(key), lo, hi, out)
        full = twin(n, key)
        assert sorted(full) == list(range(n)) and out.tolist() == full[lo:hi]


def test_large_cycles_are_permutations_and_slices_agree():
    from streambatch.core.shuffle import SMALL, permutation_slice

    for n in (SMALL - 1, SMALL, SMALL + 3, 3 * SMALL + 1):
        whole = permutation_slice(n, 12345, 0, n)
        assert np.array_equal(np.sort(whole), np.arange(n))
        assert np.array_equal(permutation_slice(n, 12345, n // 3, n // 2), whole[n // 3 : n // 2])
        assert abs(np.corrcoef(np.arange(n), whole)[0, 1]) < 0.02
