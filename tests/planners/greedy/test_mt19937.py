"""The Numba MT19937 kernels against CPython's ``random.Random`` itself."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.planners.greedy.mt19937 import genrand_uint32, getrandbits, mt_new, randbelow, shuffle_slice
from streambatch.planners.toolkit import seed_key
from tests.support.helpers import examples

SEEDS = [0, 1, -1, 42, 43, -42, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1, 2**64, 2**64 + 5,
         -(2**64 + 5), 2**70 + 12345, 2**200 + 3, 10**40]

# state = (624 words..., position); CPython's getstate() holds exactly that tuple
python_state = lambda rng: list(rng.getstate()[1])  # noqa: E731


def fresh(seed: int) -> tuple[np.ndarray, random.Random]:
    return mt_new(seed_key(seed)), random.Random(seed)


def test_seed_key_splits_abs_seed_into_32_bit_words():
    assert seed_key(0).tolist() == [0]
    assert seed_key(-5).tolist() == [5]
    assert seed_key(2**32 + 7).tolist() == [7, 1]
    assert seed_key(2**64).tolist() == [0, 0, 1]
    assert seed_key(2**40).dtype == np.uint32


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_state_equals_cpython(seed):
    mt, rng = fresh(seed)
    assert mt.tolist() == python_state(rng)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(-(2**130), 2**130))
def test_seeded_state_equals_cpython_any_seed(seed):
    mt, rng = fresh(seed)
    assert mt.tolist() == python_state(rng)


@pytest.mark.parametrize("seed", [0, -7, 2**64 + 5])
def test_uint32_stream_across_several_twists(seed):
    mt, rng = fresh(seed)
    ours = [genrand_uint32(mt) for _ in range(624 * 3 + 5)]
    assert ours == [rng.getrandbits(32) for _ in range(624 * 3 + 5)]
    assert mt.tolist() == python_state(rng)


@pytest.mark.parametrize("seed", [0, 42, -(2**65)])
def test_getrandbits_every_width(seed):
    mt, rng = fresh(seed)
    # interleave widths so that one- and two-word draws alternate across twists
    widths = [k for _ in range(12) for k in range(1, 64)]
    ours = [getrandbits(mt, k) for k in widths]
    theirs = [rng.getrandbits(k) for k in widths]
    assert ours == theirs
    assert max(ours) >= 2**62  # the 63-bit draws really use the high word
    assert mt.tolist() == python_state(rng)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(-(2**80), 2**80), st.lists(st.integers(1, 63), max_size=80))
def test_getrandbits_any_widths(seed, widths):
    mt, rng = fresh(seed)
    assert [getrandbits(mt, k) for k in widths] == [rng.getrandbits(k) for k in widths]


RANDBELOW_BOUNDS = [1, 2, 3, 5, 7, 64, 65, 1000, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1, 2**32, 2**32 + 1,
                    3 * 2**40 + 1, 2**62, 2**62 + 1, 2**63 - 1]


@pytest.mark.parametrize("seed", [0, 2024, -(2**66)])
def test_randbelow_matches_cpython(seed):
    mt, rng = fresh(seed)
    bounds = RANDBELOW_BOUNDS * 20
    ours = [randbelow(mt, n) for n in bounds]
    assert ours == [rng._randbelow(n) for n in bounds]
    assert all(0 <= r < n for r, n in zip(ours, bounds))
    assert mt.tolist() == python_state(rng)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(0, 2**40), st.lists(st.integers(1, 2**63 - 1), max_size=40))
def test_randbelow_any_bound(seed, bounds):
    mt, rng = fresh(seed)
    assert [randbelow(mt, n) for n in bounds] == [rng._randbelow(n) for n in bounds]


def test_shuffle_every_size_up_to_2000():
    # one continuous stream: a wrong draw count at any size derails every later size
    mt, rng = fresh(12345)
    for m in range(2001):
        x = np.arange(m, dtype=np.int64)
        ref = list(range(m))
        shuffle_slice(mt, x, 0, m)
        rng.shuffle(ref)
        assert x.tolist() == ref, f"size {m}"
    assert mt.tolist() == python_state(rng)


@pytest.mark.parametrize("m, seed", [(65_536, 0), (65_537, 7), (100_003, -(2**64 + 1))])
def test_shuffle_large(m, seed):
    mt, rng = fresh(seed)
    x = np.arange(m, dtype=np.int64)
    ref = list(range(m))
    shuffle_slice(mt, x, 0, m)
    rng.shuffle(ref)
    assert x.tolist() == ref
    assert mt.tolist() == python_state(rng)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_shuffle_slice_touches_only_the_slice(dtype):
    mt, rng = fresh(99)
    x = np.arange(50, dtype=dtype) * 3
    ref = x.tolist()
    middle = ref[10:37]
    shuffle_slice(mt, x, 10, 37)
    rng.shuffle(middle)
    assert x.tolist() == ref[:10] + middle + ref[37:]
    assert mt.tolist() == python_state(rng)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(-(2**70), 2**70), st.lists(st.integers(-5, 5), max_size=300), st.data())
def test_shuffle_slice_any(seed, values, data):
    lo = data.draw(st.integers(0, len(values)))
    hi = data.draw(st.integers(lo, len(values)))
    mt, rng = fresh(seed)
    x = np.array(values, dtype=np.int64)
    middle = values[lo:hi]
    shuffle_slice(mt, x, lo, hi)
    rng.shuffle(middle)
    assert x.tolist() == values[:lo] + middle + values[hi:]
    assert mt.tolist() == python_state(rng)
