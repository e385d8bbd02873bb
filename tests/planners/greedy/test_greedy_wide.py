"""The greedy planner at world sizes past the property tests' 16, and the kernel's rotation heaps.

The kernel keeps each group's ranks in a pairing heap keyed by rotation (``kernels._pop_root``,
``_meld``); these tests drive the heaps directly against Python sets, compare wide plans with the
pure-Python seed twin, and pin plan fingerprints at W up to 1024 recorded from the kernel that scanned
the ranks instead (commit 5d23ac8), so the faster structure must plan bit for bit alike.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from streambatch import make_plan
from streambatch.planners.greedy.placement import _CHILD, _ROOT, _SIB, _Groups, _meld, _pop_root, _reset
from tests.planners.greedy.test_greedy import cfg_of, check_against_naive


@njit(cache=True)
def _replay(w, n_groups, src, dst, popped):
    """Group 0 starts with every rotation 0..w-1 (as each step does), the others empty; op i takes
    the smallest rotation out of group src[i], records it in popped[i] (-1: the group was empty) and
    puts it into group dst[i] (dst[i] = -1: nowhere)."""
    groups = _Groups(w)
    _reset(groups, w)
    for g in range(1, n_groups):
        groups[_ROOT, g] = -1
    for i in range(src.shape[0]):
        g = src[i]
        d = groups[_ROOT, g]
        popped[i] = d
        if d < 0:
            continue
        _pop_root(groups, g)
        if dst[i] >= 0:
            groups[_CHILD, d] = -1
            groups[_SIB, d] = -1
            groups[_ROOT, dst[i]] = _meld(groups, groups[_ROOT, dst[i]], d)


@pytest.mark.parametrize("w, n_groups, n_ops", [(1, 1, 5), (2, 2, 50), (3, 3, 200), (64, 4, 3000),
                                                (1024, 6, 40_000), (1024, 40, 40_000)])
def test_rotation_heaps_pop_the_smallest(w, n_groups, n_ops):
    rs = np.random.default_rng(w * 1000 + n_groups)
    # moves biased towards group 0, so some heaps grow large and others drain and refill
    src = rs.integers(0, n_groups, n_ops) * (rs.random(n_ops) < 0.8)
    dst = rs.integers(0, n_groups, n_ops)
    sets = [set(range(w))] + [set() for _ in range(n_groups - 1)]
    want = []
    for g, h in zip(src.tolist(), dst.tolist()):
        d = min(sets[g]) if sets[g] else -1
        want.append(d)
        if d >= 0:
            sets[g].remove(d)
            sets[h].add(d)
    # then empty every group: each heap must still hold exactly its rotations, smallest first
    drain = [g for g in range(n_groups) for _ in range(len(sets[g]) + 1)]
    want += [d for g in range(n_groups) for d in sorted(sets[g]) + [-1]]
    src = np.concatenate([src, np.array(drain, dtype=np.int64)])
    dst = np.concatenate([dst, np.full(len(drain), -1, dtype=np.int64)])
    popped = np.empty(src.shape[0], dtype=np.int64)
    _replay(w, n_groups, src, dst, popped)
    assert popped.tolist() == want


def formula_lengths(n: int, kind: str) -> np.ndarray:
    """(n,) int64 portable deterministic lengths (integer arithmetic, no RNG stream that numpy may change)."""
    i = np.arange(n, dtype=np.int64)
    h = (i * 2654435761 + 12345) % 4294967296
    if kind == "constant":
        return np.full(n, 40, dtype=np.int64)
    if kind == "audio":  # frame counts 25..1452, mostly short
        return 25 + ((h >> 8) % 1000) ** 2 // 700
    if kind == "heavy":  # mostly short, every 97th sample far longer
        return np.where(i % 97 == 0, 3000 + h % 20000, 20 + h % 200)
    raise ValueError(kind)


# the fast tier takes a third of them (one shuffle setting per kind, W = 17 and 40); --full all
WIDE = [pytest.param(w, kind, shuffle, marks=() if w != 24 and shuffle == (kind != "audio") else pytest.mark.slow)
        for w in (17, 24, 40) for kind in ("constant", "audio", "heavy") for shuffle in (True, False)]


@pytest.mark.parametrize("world_size, kind, shuffle", WIDE)
def test_wide_worlds_match_naive(world_size, kind, shuffle):
    # a few steps of a few samples per rank: many ranks tie and the rotation decides among groups
    n = world_size * 9 + 5
    lengths = formula_lengths(n, kind).tolist()
    budget = {"constant": 120, "audio": 2500, "heavy": 900}[kind]
    check_against_naive(lengths, cfg_of(budget, b=4, w=world_size, shuffle=shuffle, seed=world_size, epoch=1))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [64, 100, 128])
@pytest.mark.parametrize("kind", ["constant", "audio"])
def test_wider_worlds_match_naive(world_size, kind):
    n = world_size * 7 + 3
    lengths = formula_lengths(n, kind).tolist()
    check_against_naive(lengths, cfg_of(120 if kind == "constant" else 2500, b=3, w=world_size, seed=3))


# make_plan(formula_lengths(n, kind), budget, cap, w, drop_last=..., seed=11, epoch=2).fingerprint(), keyed by
# (kind, n, w, budget, cap, drop_last), computed at commit 5d23ac8 (the kernel that scanned all W ranks for a
# group's member): cap-bound, budget-bound and both, all ties (constant) and a heavy tail
PINNED = {
    ('constant', 200000, 100, 16000, 64, False): 3563173851248029902,
    ('constant', 200000, 100, 10**12, 16, False): 759258404513199496,
    ('constant', 200000, 100, 4000, 10**9, False): 3812842612314993698,
    ('constant', 200000, 333, 16000, 64, False): 2565907816254198573,
    ('constant', 200000, 333, 10**12, 16, False): 4381334615227119687,
    ('constant', 200000, 333, 4000, 10**9, False): 2378650914706933069,
    ('constant', 200000, 512, 16000, 64, True): 2938668037380913593,
    ('constant', 200000, 512, 10**12, 16, True): 3582200049075727553,
    ('constant', 200000, 512, 4000, 10**9, True): 4010766259134321289,
    ('constant', 200000, 1024, 16000, 64, False): 972051155432841706,
    ('constant', 200000, 1024, 10**12, 16, False): 483650348404965935,
    ('constant', 200000, 1024, 4000, 10**9, False): 2152788494428358221,
    ('audio', 200000, 100, 16000, 64, False): 2729914805707200286,
    ('audio', 200000, 100, 10**12, 16, False): 263644291331280166,
    ('audio', 200000, 100, 4000, 10**9, False): 1491084439423382035,
    ('audio', 200000, 333, 16000, 64, False): 969956830368050980,
    ('audio', 200000, 333, 10**12, 16, False): 4382790836983899425,
    ('audio', 200000, 333, 4000, 10**9, False): 4139780288298947222,
    ('audio', 200000, 512, 16000, 64, True): 4076681856348658414,
    ('audio', 200000, 512, 10**12, 16, True): 2747308560610214277,
    ('audio', 200000, 512, 4000, 10**9, True): 3248146652474805271,
    ('audio', 200000, 1024, 16000, 64, False): 4297518879154872142,
    ('audio', 200000, 1024, 10**12, 16, False): 113915718583955301,
    ('audio', 200000, 1024, 4000, 10**9, False): 3719894647824198572,
    ('heavy', 200000, 100, 16000, 64, False): 1790138277197844644,
    ('heavy', 200000, 100, 10**12, 16, False): 1445509954474526932,
    ('heavy', 200000, 100, 4000, 10**9, False): 3403972502393427448,
    ('heavy', 200000, 333, 16000, 64, False): 485804031046303084,
    ('heavy', 200000, 333, 10**12, 16, False): 4031913861320922709,
    ('heavy', 200000, 333, 4000, 10**9, False): 1758438712254918955,
    ('heavy', 200000, 512, 16000, 64, True): 2340946943674178039,
    ('heavy', 200000, 512, 10**12, 16, True): 2955348252711877658,
    ('heavy', 200000, 512, 4000, 10**9, True): 3646317097605686520,
    ('heavy', 200000, 1024, 16000, 64, False): 4139014399772396450,
    ('heavy', 200000, 1024, 10**12, 16, False): 1334151727322438189,
    ('heavy', 200000, 1024, 4000, 10**9, False): 1819936771954545532,
}


@pytest.mark.parametrize("key", [
    # the fast tier checks W = 512 (budget 16,000, cap 64) and W = 1024 (cap-bound) for each kind; --full all
    pytest.param(k, marks=() if (k[2], k[4]) in ((512, 64), (1024, 16)) else pytest.mark.slow,
                 id="-".join(map(str, k)))
    for k in sorted(PINNED)])
def test_fingerprints_pinned_at_large_worlds(key):
    kind, n, w, budget, cap, drop_last = key
    plan = make_plan(formula_lengths(n, kind), budget, cap, w, drop_last=drop_last, seed=11, epoch=2)
    assert plan.fingerprint() == PINNED[key]
