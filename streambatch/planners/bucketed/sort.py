"""Bucket sort kernels: samples counting-sorted into length buckets, shuffled
inside each bucket, both ends ordered towards the densest bucket."""

from __future__ import annotations

import numpy as np

from ...core.hashing import _mix
from .common import _helper, njit

_TAGS = 512  # within-bucket shuffle: one radix pass over 512 random tags
_TABLE_MAX = 1 << 22  # longest length a bucket lookup table is built for (else: bisection)


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
def _bucket_table(edges, max_len, n):
    """(max_len + 1,) int32 bucket of every length, or an empty table when
    lengths are too large for one, or it would cost more than the n lookups
    it saves (``_bucket_of`` then bisects)."""
    k = edges.shape[0]
    if max_len >= _TABLE_MAX or max_len > 8 * n + 1024:
        return np.zeros(0, dtype=np.int32)
    table = np.empty(max_len + 1, dtype=np.int32)
    b = 0
    for v in range(max_len + 1):
        while b < k and edges[b] <= v:
            b += 1
        table[v] = b
    return table


@_helper
def _histograms(lengths, edges, table, key, shuffle, size, tags):
    mask = np.uint64(_TAGS - 1)
    for i in range(lengths.shape[0]):
        size[_bucket_of(lengths[i], edges, table)] += 1
    if shuffle:
        for i in range(lengths.shape[0]):
            tags[np.int64(_mix(key, np.uint64(i)) & mask) + 1] += 1


@_helper
def _scatter_by_tag(lengths, key, tags, tmp_idx, tmp_len):
    mask = np.uint64(_TAGS - 1)
    for i in range(lengths.shape[0]):
        ln = lengths[i]
        t = np.int64(_mix(key, np.uint64(i)) & mask)
        at = tags[t]  # one load: LLVM cannot rule out that the stores alias it
        tmp_idx[at] = i
        tmp_len[at] = ln
        tags[t] = at + 1


@_helper
def _scatter_by_bucket(idx, lengths, edges, table, start, order, slen):
    """order/slen[start[b]...] = idx/lengths of the samples in bucket b, in
    input order. idx may be empty: then sample i is i."""
    with_idx = idx.shape[0] > 0
    for j in range(lengths.shape[0]):
        ln = lengths[j]
        b = _bucket_of(np.int64(ln), edges, table)
        at = start[b]
        order[at] = idx[j] if with_idx else j
        slen[at] = ln
        start[b] = at + 1


@_helper
def _dense_bucket(edges, size, max_tokens, max_size):
    """The bucket a full step spans the smallest share of: most samples per
    sample a step can take (size cap, or budget / length)."""
    dense = 0
    best = -1.0
    for b in range(size.shape[0]):
        low = edges[b - 1] if b > 0 else 0
        score = size[b] / min(float(max_size), max_tokens / max(low, 1))
        if score > best:
            best = score
            dense = b
    return dense


@njit(cache=True)
def bucket_sort(lengths, max_len, edges, key, shuffle, max_tokens, max_size, order, slen, tmp_idx, tmp_len):
    """Order samples by length bucket, shuffled within each bucket, so that
    steps laid out from both ends meet where lengths are densest.

    lengths: (n,) int64 in [0, max_len]. edges: (k,) int64 strictly
    increasing, >= 1; bucket b holds lengths in [edges[b-1], edges[b])
    (bucket 0 below edges[0], bucket k from edges[k-1] up). key: uint64 seed
    of the shuffle. order: (n,) int receives sample indices, slen: (n,) int
    their lengths (any integer dtype wide enough); tmp_idx, tmp_len: (>= n,)
    scratch of the same dtypes.

    With d the densest bucket (``_dense_bucket``), buckets 0..d come first in
    ascending order, then buckets k..d+1 in descending order. Returns m, the
    number of samples in buckets 0..d.

    Shuffling is a least-significant-digit radix sort: samples are first
    ordered by a random tag in [0, _TAGS) drawn from (key, index), then
    stably by bucket. Within a bucket that is a uniform shuffle for buckets
    of up to a few hundred samples and a random partition into _TAGS runs
    (each in index order) for larger ones. Without ``shuffle`` buckets keep
    index order.
    """
    k = edges.shape[0]
    table = _bucket_table(edges, max_len, lengths.shape[0])
    size = np.zeros(k + 1, dtype=np.int64)
    tags = np.zeros(_TAGS + 1, dtype=np.int64)
    _histograms(lengths, edges, table, key, shuffle, size, tags)
    dense = _dense_bucket(edges, size, max_tokens, max_size)
    start = np.empty(k + 1, dtype=np.int64)
    acc = 0
    for b in range(dense + 1):
        start[b] = acc
        acc += size[b]
    m = acc
    for b in range(k, dense, -1):
        start[b] = acc
        acc += size[b]
    if not shuffle:
        _scatter_by_bucket(tmp_idx[:0], lengths, edges, table, start, order, slen)
        return m
    for t in range(_TAGS):
        tags[t + 1] += tags[t]
    n = lengths.shape[0]
    _scatter_by_tag(lengths, key, tags, tmp_idx[:n], tmp_len[:n])
    _scatter_by_bucket(tmp_idx[:n], tmp_len[:n], edges, table, start, order, slen)
    return m
