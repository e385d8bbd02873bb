"""The ordering kernels: stable radix argsort and the seed's sortish order."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streambatch.planners.greedy.mt19937 import mt_new
from streambatch.planners.greedy.order import sortish_order
from streambatch.planners.greedy.reference import chunk_size
from streambatch.planners.greedy.reference import sortish_order as naive_sortish
from streambatch.planners.toolkit import radix_argsort, seed_key
from tests.support.helpers import examples

INT64_MAX = 2**63 - 1


def argsort(keys, dtype=np.int64) -> list[int]:
    keys = np.asarray(keys, dtype=np.int64)
    out = np.full(keys.shape[0] + 3, -1, dtype=dtype)
    tmp = np.full(keys.shape[0] + 3, -1, dtype=dtype)
    radix_argsort(keys, out, tmp)
    assert out[keys.shape[0]:].tolist() == [-1, -1, -1]  # nothing written past n
    return out[: keys.shape[0]].tolist()


def stable(keys) -> list[int]:
    return np.argsort(np.asarray(keys, dtype=np.int64), kind="stable").tolist()


key_lists = st.one_of(
    st.lists(st.integers(0, 3)),  # mostly duplicates
    st.lists(st.integers(0, 5000)),  # one or two 11-bit digits
    st.lists(st.integers(0, INT64_MAX)),  # every digit, top digit partial
    st.lists(st.sampled_from([0, 1, 2047, 2048, 2**22, 2**33 + 1, 2**55, 2**56 - 1, 2**62, INT64_MAX])),
    st.lists(st.integers(2**60, 2**60 + 3)),  # low digits vary, high digits constant
)


@settings(max_examples=examples(300), deadline=None)
@given(key_lists, st.sampled_from([np.int32, np.int64]))
@example([], np.int64)
@example([5], np.int64)
@example([INT64_MAX, 0, INT64_MAX, 2**55, 1, 2**62 + 2047, 2**62], np.int64)
@example([2**56 + 4, 2**56, 4, 0], np.int32)
def test_radix_argsort_is_stable_argsort(keys, dtype):
    assert argsort(keys, dtype) == stable(keys)


def test_radix_argsort_large_random():
    rng = np.random.default_rng(0)
    for high in (2**11, 2**16, 2**40, INT64_MAX):
        keys = rng.integers(0, high, 200_000, dtype=np.int64)
        assert argsort(keys) == stable(keys)


def ours(lengths, size, seed, dtype=np.int64):
    lengths = np.asarray(lengths, dtype=np.int64)
    mt = mt_new(seed_key(seed))
    n = lengths.shape[0]
    out = np.empty(n + 2, dtype=dtype)
    tmp = np.empty(n + 2, dtype=dtype)
    sortish_order(lengths, size, mt, out, tmp, np.empty(-(-n // size), dtype=dtype))
    return out[:n].tolist(), mt


def reference(lengths, size, seed):
    rng = random.Random(seed)
    return naive_sortish(list(lengths), size, rng), rng


@settings(max_examples=examples(150), deadline=None)
@given(
    st.one_of(st.lists(st.integers(0, 4), max_size=1500), st.lists(st.integers(0, 10**9), max_size=1500)),
    st.one_of(st.integers(1, 10), st.sampled_from([64, 128, 511, 512])),
    st.integers(-(2**70), 2**70),
    st.sampled_from([np.int32, np.int64]),
)
@example([], 64, 0, np.int64)
@example([7] * 130, 64, 42, np.int64)  # all equal: stability decides the chunks
def test_sortish_order_matches_naive(lengths, size, seed, dtype):
    got, mt = ours(lengths, size, seed, dtype)
    want, rng = reference(lengths, size, seed)
    assert got == want
    # the stream is left exactly where the seed leaves it (the step shuffle comes next)
    assert mt.tolist() == list(rng.getstate()[1])


@pytest.mark.parametrize("world_size, max_batch_size", [(1, 1), (1, 8), (2, 16), (8, 64), (16, 64)])
def test_sortish_order_seed_chunk_sizes_large(world_size, max_batch_size):
    size = chunk_size(world_size, max_batch_size)
    lengths = np.random.default_rng(world_size).integers(0, 3000, 20_000).tolist()
    got, mt = ours(lengths, size, 42 + world_size)
    want, rng = reference(lengths, size, 42 + world_size)
    assert got == want
    assert mt.tolist() == list(rng.getstate()[1])
