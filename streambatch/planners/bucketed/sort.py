"""Bucket sort kernels: samples counting-sorted into length buckets, shuffled
inside each bucket, both ends ordered towards the densest bucket."""

from __future__ import annotations

import numpy as np

from ..toolkit import _helper, _mix, _new, njit

_TAGS = 512  # within-bucket shuffle: one radix pass over 512 random tags
_TABLE_MAX = 1 << 22  # longest length a bucket lookup table is built for (else: bisection)


def table_size(max_len: int, n: int) -> int:
    """Entries of the bucket lookup table ``bucket_sort`` takes: max_len + 1,
    or 0 (bisect instead) when lengths are too large for one or it would
    cost more than the n lookups it saves."""
    return 0 if max_len >= _TABLE_MAX or max_len > 8 * n + 1024 else max_len + 1


@_helper
def _bucket_of(length, edges, table):
    if table.shape[0] > 0:
        return np.int64(table[length])
    lo = 0
    hi = edges.shape[0]
    while lo < hi:  # number of edges <= length
        mid = (lo + hi) >> 1
        if edges[mid] <= length:
            lo = mid + 1
        else:
            hi = mid
    return np.int64(lo)


@_helper
def _histograms(lengths, edges, table, key, shuffle, size, tags):
    """size[b] += samples in bucket b; tags[t + 1] += samples of tag t."""
    mask = np.uint64(_TAGS - 1)
    for i in range(lengths.shape[0]):
        size[_bucket_of(lengths[i], edges, table)] += 1
    if shuffle:
        for i in range(lengths.shape[0]):
            tags[np.int64(_mix(key, np.uint64(i)) & mask) + 1] += 1
    else:
        tags[1] = lengths.shape[0]  # every sample tag 0: index order


@_helper
def _scatter_by_tag(lengths, key, shuffle, tags, tmp_idx, tmp_len):
    mask = np.uint64(_TAGS - 1)
    for i in range(lengths.shape[0]):
        ln = lengths[i]
        t = np.int64(_mix(key, np.uint64(i)) & mask) if shuffle else 0
        at = tags[t]  # one load: LLVM cannot rule out that the stores alias it
        tmp_idx[at] = i
        tmp_len[at] = ln
        tags[t] = at + 1


@_helper
def _scatter_by_bucket(idx, lengths, edges, table, start, order, slen):
    """order/slen[start[b]...] = idx/lengths of the samples in bucket b, in
    input order."""
    for j in range(lengths.shape[0]):
        ln = lengths[j]
        b = _bucket_of(np.int64(ln), edges, table)
        at = start[b]
        order[at] = idx[j]
        slen[at] = ln
        start[b] = at + 1


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def bucket_sort(lengths, edges, table, key, shuffle, max_tokens, max_size, order, slen, tmp_idx, tmp_len):
    """Order samples by length bucket, shuffled within each bucket, so that
    steps laid out from both ends meet where lengths are densest.

    lengths: (n,) int64 >= 0. edges: (k,) int64 strictly increasing, >= 1;
    bucket b holds lengths in [edges[b-1], edges[b]) (bucket 0 below
    edges[0], bucket k from edges[k-1] up). table: (max_len + 1,) int32
    scratch for a bucket lookup table, or (0,) to bisect (``table_size``).
    key: uint64 seed of the shuffle. order: (n,) int receives sample
    indices, slen: (n,) int their lengths (any integer dtype wide enough);
    tmp_idx, tmp_len: (n,) scratch of the same dtypes.

    With d the densest bucket (see below), buckets 0..d come first in
    ascending order, then buckets k..d+1 in descending order. Returns m, the
    number of samples in buckets 0..d.

    Shuffling is a least-significant-digit radix sort: samples are first
    ordered by a random tag in [0, _TAGS) drawn from (key, index), then
    stably by bucket. Within a bucket that is a uniform shuffle for buckets
    of up to a few hundred samples and a random partition into _TAGS runs
    (each in index order) for larger ones. Without ``shuffle`` every tag is 0:
    buckets keep index order.
    """
    k = edges.shape[0]
    b = 0
    for v in range(table.shape[0]):  # the bucket of every length (if a table is used)
        while b < k and edges[b] <= v:
            b += 1
        table[v] = b
    size = _new(k + 1)
    start = _new(k + 1)
    tags = _new(_TAGS + 1)
    for b in range(k + 1):
        size[b] = 0
    for t in range(_TAGS + 1):
        tags[t] = 0
    _histograms(lengths, edges, table, key, shuffle, size, tags)
    # The densest bucket: the one a full step spans the smallest share of
    # (most samples per sample a step can take: size cap, or budget / length).
    dense = 0
    best = -1.0
    for b in range(k + 1):
        low = edges[b - 1] if b > 0 else 0
        per_sample = max_tokens / low if low > 1 else float(max_tokens)
        score = size[b] / (per_sample if per_sample < max_size else float(max_size))
        if score > best:
            best = score
            dense = b
    acc = 0
    for b in range(dense + 1):
        start[b] = acc
        acc += size[b]
    m = acc
    for b in range(k, dense, -1):
        start[b] = acc
        acc += size[b]
    for t in range(_TAGS):
        tags[t + 1] += tags[t]
    _scatter_by_tag(lengths, key, shuffle, tags, tmp_idx, tmp_len)
    _scatter_by_bucket(tmp_idx, tmp_len, edges, table, start, order, slen)
    return m
