"""Numba kernels of the bucketed planner: bucket sort with a seeded shuffle
inside each bucket, then step-by-step layout of the sorted samples.

Arrays and integer scalars in, arrays out; inputs are validated by the plan
layer (``bucketed.py``). Batch costs are integers (see ``cost.py``):

    code 0: count * L          code 1: count * L**2
    code 2: count * L * (q + L)     (= q * count * (L + L**2 / q))

Randomness is counter-based (a splitmix64 finaliser of ``key ^ counter``), so
every draw is a pure function of the 64-bit key and its position.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...core.hashing import _mix

_TAGS = 512  # within-bucket shuffle: one radix pass over 512 random tags
_TABLE_MAX = 1 << 22  # longest length a bucket lookup table is built for (else: bisection)
_U32 = np.uint64(32)
# Weights of the waste terms when choosing a step's layout (``_waste_rate``),
# roughly inverse to the slack the targets leave each: balance 0.98, padding
# 0.97, budget use 0.9 (tempered, so that fill is not sacrificed wholesale).
_W_BALANCE = 1.25
_W_PADDING = 1.0
_W_FILL = 0.5
_SETTLED = 0.995  # a greedy step this balanced is taken without trying other layouts
_NARROW = 20  # a narrow deal spans at most 1 + 1/_NARROW in length


@njit(cache=True)
def _below(key, counter, n):
    """A draw in [0, n) from (key, counter); n >= 1."""
    r = _mix(key, np.uint64(counter))
    if n < (1 << 32):
        return np.int64(((r >> _U32) * np.uint64(n)) >> _U32)
    return np.int64(r % np.uint64(n))


@njit(cache=True)
def batch_cost(code, q, count, max_len):
    """Integer cost of ``count`` samples padded to ``max_len`` (codes above)."""
    if code == 0:
        return count * max_len
    if code == 1:
        return count * max_len * max_len
    return count * max_len * (q + max_len)


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def _histograms(lengths, edges, table, key, shuffle, size, tags):
    mask = np.uint64(_TAGS - 1)
    for i in range(lengths.shape[0]):
        size[_bucket_of(lengths[i], edges, table)] += 1
    if shuffle:
        for i in range(lengths.shape[0]):
            tags[np.int64(_mix(key, np.uint64(i)) & mask) + 1] += 1


@njit(cache=True)
def _scatter_by_tag(lengths, key, tags, tmp_idx, tmp_len):
    mask = np.uint64(_TAGS - 1)
    for i in range(lengths.shape[0]):
        ln = lengths[i]
        t = np.int64(_mix(key, np.uint64(i)) & mask)
        at = tags[t]  # one load: LLVM cannot rule out that the stores alias it
        tmp_idx[at] = i
        tmp_len[at] = ln
        tags[t] = at + 1


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def _contiguous(slen, p, w, max_tokens, max_size, code, q, limit, sizes, maxes):
    """W batches of consecutive samples from ``p``, each filled until the next
    sample would break the size cap, token budget or cost ``limit``.

    Fills sizes/maxes (W,). Returns (end, complete, real tokens): complete is
    False when the data ran out before the W-th batch was closed by a limit.
    """
    n = slen.shape[0]
    pos = p
    real = 0
    for r in range(w):
        if pos >= n:
            return pos, False, real
        cnt = 1
        mx = slen[pos]
        real += mx
        pos += 1
        closed = False
        while pos < n:
            ln = slen[pos]
            nm = max(mx, ln)
            if cnt + 1 > max_size or (cnt + 1) * nm > max_tokens or batch_cost(code, q, cnt + 1, nm) > limit:
                closed = True
                break
            cnt += 1
            mx = nm
            real += ln
            pos += 1
        sizes[r] = cnt
        maxes[r] = mx
        if not closed and r == w - 1:
            return pos, False, real
    return pos, True, real


@njit(cache=True)
def _deal_size(slen, p, w, max_tokens, max_size, code, q, max_cost):
    """How many samples per rank a deal of the samples from ``p`` can take.

    Returns (b, b_narrow, complete): b is the largest count such that the
    W * b samples from p, dealt over W ranks, fit the size cap, token budget
    and cost limit on every rank (each rank's longest is at most the segment's
    longest); b_narrow <= b the largest whose segment spans at most a factor
    1 + 1/_NARROW in length (0 if none); complete is False when the data
    bounded b. Needs p + W <= n. Works in either direction of slen.
    """
    n = slen.shape[0]
    mx = 0
    mn = np.iinfo(np.int64).max
    for j in range(p, p + w):
        mx = max(mx, slen[j])
        mn = min(mn, slen[j])
    b = 1
    b_narrow = 1 if mx * _NARROW <= mn * (_NARROW + 1) else 0
    complete = True
    while True:
        nb = b + 1
        if nb > max_size:
            break
        if p + w * nb > n:
            complete = False
            break
        nm = mx
        for j in range(p + w * b, p + w * nb):
            nm = max(nm, slen[j])
            mn = min(mn, slen[j])
        if nb * nm > max_tokens or batch_cost(code, q, nb, nm) > max_cost:
            break
        b = nb
        mx = nm
        if b_narrow == b - 1 and mx * _NARROW <= mn * (_NARROW + 1):
            b_narrow = b
    return b, b_narrow, complete


@njit(cache=True)
def _deal_rank(t, m, w):
    """Layout slot of the t-th longest of m dealt samples: rounds of W in
    slot order, except that a final partial round goes to the last slots,
    whose longest samples are the shortest."""
    j = t % w
    if m % w != 0 and t >= m - m % w:
        return w - 1 - j
    return j


@njit(cache=True)
def _deal_stats(slen, lo, hi, w, sizes, maxes):
    """Sizes and longest sample per slot of dealing slen[lo:hi] from its end
    (the longest, when slen ascends). Returns the real tokens."""
    m = hi - lo
    real = 0
    for r in range(w):
        sizes[r] = 0
        maxes[r] = 0
    for t in range(m):
        r = _deal_rank(t, m, w)
        ln = slen[hi - 1 - t]
        real += ln
        sizes[r] += 1
        maxes[r] = max(maxes[r], ln)
    return real


@njit(cache=True)
def _waste_rate(sizes, maxes, real, w, max_tokens, max_size, code, q, max_cost, cost_limited):
    """Weighted tokens wasted per real token, summing padding, straggler time
    (padded tokens x (1 - balance)) and the unused capacity of batches below
    their limit (budget, size cap or cost cap, whichever binds)."""
    padded = 0.0
    csum = 0.0
    cmax = 0.0
    unused = 0.0
    for r in range(w):
        tok = float(sizes[r] * maxes[r])
        c = float(batch_cost(code, q, sizes[r], maxes[r]))
        padded += tok
        csum += c
        cmax = max(cmax, c)
        fill = max(tok / max_tokens, sizes[r] / max_size)
        if cost_limited:
            fill = max(fill, c / max_cost)
        if 0.0 < fill < 1.0:
            unused += tok * (1.0 / fill - 1.0)
    balance = csum / (w * cmax) if cmax > 0.0 else 1.0
    waste = _W_BALANCE * padded * (1.0 - balance) + _W_PADDING * (padded - real) + _W_FILL * unused
    return waste / max(float(real), 1.0), balance


@njit(cache=True)
def _fits(count, max_len, max_tokens, max_size, code, q, max_cost):
    return count <= 1 or (count <= max_size and count * max_len <= max_tokens
                          and batch_cost(code, q, count, max_len) <= max_cost)


@njit(cache=True)
def _even_rate(m, mx, real, w, max_tokens, max_size, code, q, max_cost, cost_limited, sizes, maxes):
    """``_waste_rate`` of dealing m samples (longest mx) evenly, every rank's
    longest taken as mx: a cheap estimate for choosing where to split."""
    for r in range(w):
        sizes[r] = m // w + (1 if r < m % w else 0)
        maxes[r] = mx
    return _waste_rate(sizes, maxes, real, w, max_tokens, max_size, code, q, max_cost, cost_limited)[0]


@njit(cache=True)
def _finish_split(slen, p, w, max_tokens, max_size, code, q, max_cost, cost_limited, sizes, maxes):
    """Where to split the last samples slen[p:] (ascending by bucket) into at
    most two evenly dealt steps: returns h (the first step is slen[p:p+h],
    the second the rest; h = n - p for a single step), or -1 when no split
    fits the limits. Chooses the least total ``_waste_rate``, estimated with
    every rank's longest taken as its step's longest."""
    n = slen.shape[0]
    m = n - p
    pre = np.empty(m + 1, dtype=np.int64)  # longest and total of the first i samples
    tot = np.empty(m + 1, dtype=np.int64)
    pre[0] = 0
    tot[0] = 0
    for i in range(m):
        pre[i + 1] = max(pre[i], slen[p + i])
        tot[i + 1] = tot[i] + slen[p + i]
    suf = np.empty(m + 1, dtype=np.int64)  # longest of slen[p+i:]
    suf[m] = 0
    for i in range(m - 1, -1, -1):
        suf[i] = max(suf[i + 1], slen[p + i])
    best = -1
    best_rate = np.inf
    h = m
    while h >= w:
        rest = m - h
        if rest == 0 or rest >= w:
            ba = (h + w - 1) // w
            bb = (rest + w - 1) // w
            if (_fits(ba, pre[h], max_tokens, max_size, code, q, max_cost)
                    and (rest == 0 or _fits(bb, suf[h], max_tokens, max_size, code, q, max_cost))):
                rate = _even_rate(h, pre[h], tot[h], w, max_tokens, max_size, code, q, max_cost,
                                  cost_limited, sizes, maxes) * tot[h]
                if rest > 0:
                    rate += _even_rate(rest, suf[h], tot[m] - tot[h], w, max_tokens, max_size, code, q,
                                       max_cost, cost_limited, sizes, maxes) * (tot[m] - tot[h])
                if rate < best_rate:
                    best_rate = rate
                    best = h
        h = h - w if h % w == 0 else h - h % w
    return best


@njit(cache=True)
def _write_deal(order, lo, hi, w, rot, out, at, row, cur):
    """Deal order[lo:hi] as ``_deal_stats`` does; slot j goes to rank
    (j + rot) % W. Writes rank-major into out[at:], sizes into row (W,);
    cur: (W,) scratch. Returns the new end of out."""
    m = hi - lo
    for r in range(w):
        row[r] = 0
    for t in range(m):
        row[(_deal_rank(t, m, w) + rot) % w] += 1
    acc = at
    for r in range(w):
        cur[r] = acc
        acc += row[r]
    for t in range(m):
        r = (_deal_rank(t, m, w) + rot) % w
        out[cur[r]] = order[hi - 1 - t]
        cur[r] += 1
    return acc


@njit(cache=True)
def _write_contiguous(order, p, sizes, w, rot, out, at, row, cur):
    """Slot j's batch is the next sizes[j] samples from p; it goes to rank
    (j + rot) % W. Returns (new end of out, new p)."""
    for j in range(w):
        row[(j + rot) % w] = sizes[j]
    acc = at
    for r in range(w):
        cur[r] = acc
        acc += row[r]
    for j in range(w):
        r = (j + rot) % w
        m = sizes[j]
        out[cur[r] : cur[r] + m] = order[p : p + m]
        p += m
    return acc, p


@njit(cache=True)
def plan_steps(order, slen, w, max_tokens, max_size, code, q, max_cost, finish, drop_last, shuffle, key,
               first_step, out):
    """Lay bucket-sorted samples out as global steps of W batches.

    order, slen: (n,) sample indices and their lengths in bucket order,
    ascending or descending. max_tokens, max_size, max_cost >= 1 (int64 max
    for no cost cap). key: uint64; step s of this call turns its batches by
    a rank offset drawn from (key, first_step + s) when shuffling. out:
    (>= n,) receives samples grouped by step, then rank.

    Each step takes the next samples in order, laid out in whichever way
    wastes the fewest tokens per real token (``_waste_rate``):
      0.   W contiguous batches, each filled until the next sample would not
           fit (padding least);
      1-2. the same with every batch held to 1/0.98 or 1/0.95 of the
           cheapest one's cost in layout 0 (balance at some budget use);
      3.   W * b samples dealt over the ranks in turn, so that every rank's
           longest is among the step's W longest (balance at some padding);
      4.   such a deal stopped while the step spans <= 1 + 1/_NARROW in
           length (narrow but under-filled: for sparse lengths and gaps).
    Layouts that run out of data before a limit closes the step do not count.

    With ``finish`` False the call stops, unwritten, at the first step after
    which less than another step would remain: the caller finishes those
    samples. With ``finish`` (slen ascending), that tail is dealt evenly into
    one or two final steps (``_finish_split``); with ``drop_last`` instead,
    what cannot complete a step is left out.

    Returns (counts, n_steps, n_out, stop): counts[:n_steps] (int64, W wide) are
    the batch sizes; order[stop:] was not
    planned; the final step has empty ranks (for the caller to pad) only when
    fewer than W samples remained.
    """
    n = slen.shape[0]
    cost_limited = max_cost < np.iinfo(np.int64).max
    counts = np.zeros((max(4, n // (w * 16) + 4), w), dtype=np.int64)
    sizes = np.empty((5, w), dtype=np.int64)
    maxes = np.empty((5, w), dtype=np.int64)
    cur = np.empty(w, dtype=np.int64)
    ends = np.zeros(5, dtype=np.int64)
    rates = np.empty(5)
    pcts = (0, 98, 95)
    # With one rank there is nothing to balance: capped variants and deals
    # reduce to plain contiguous batches.
    n_contig = 3 if w > 1 else 1
    rot_key = _mix(key, np.uint64(0x5EED))
    p = 0
    n_out = 0
    step = 0
    while p < n:
        if step + 2 > counts.shape[0]:
            # explicit loops: Numba compiles slice assignment slowly
            grown = np.zeros((2 * counts.shape[0], w), dtype=np.int64)
            for i in range(step):
                for r in range(w):
                    grown[i, r] = counts[i, r]
            counts = grown
        rot = _below(rot_key, first_step + step, w) if shuffle else 0
        left = n - p
        if left < w:
            if drop_last or not finish:
                break
            for j in range(left):  # one sample on each of the first ranks
                out[n_out + j] = order[p + j]
                counts[step, j] = 1
            n_out += left
            p = n
            step += 1
            break
        for c in range(rates.shape[0]):
            rates[c] = np.inf
        cheapest = np.iinfo(np.int64).max
        settled = False
        for c in range(n_contig):
            limit = max_cost
            if c > 0:  # hold every batch to 1/0.98 or 1/0.95 of the cheapest greedy one
                if settled or cheapest == 0 or cheapest == np.iinfo(np.int64).max:
                    break
                limit = min(max_cost, cheapest + cheapest // pcts[c] * (100 - pcts[c]))
            end, complete, real = _contiguous(slen, p, w, max_tokens, max_size, code, q, limit, sizes[c], maxes[c])
            ends[c] = end
            if complete:
                rates[c], balance = _waste_rate(sizes[c], maxes[c], real, w, max_tokens, max_size, code, q,
                                                max_cost, cost_limited)
                if c == 0:
                    # Balanced already: nothing else can do much better; skip the rest.
                    settled = balance >= _SETTLED
                    for r in range(w):
                        cheapest = min(cheapest, batch_cost(code, q, sizes[0, r], maxes[0, r]))
        b = 0
        if not settled:
            b, b_narrow, complete = _deal_size(slen, p, w, max_tokens, max_size, code, q, max_cost)
        if w > 1 and not settled:
            for c, bc in ((3, b), (4, b_narrow)):
                if bc > 0 and (complete or bc < b):
                    ends[c] = p + w * bc
                    real = _deal_stats(slen, p, ends[c], w, sizes[c], maxes[c])
                    rates[c] = _waste_rate(sizes[c], maxes[c], real, w, max_tokens, max_size, code, q, max_cost,
                                           cost_limited)[0]
        best = np.argmin(rates)
        # How far a full step reaches (to the end of the data when a full
        # layout ran out first): once less than that would remain after this
        # step, the rest is finished as a whole.
        reach = ends[0] if b == 0 else max(ends[0], p + w * b if complete else n)
        near_end = rates[best] == np.inf or n - ends[best] < reach - p
        if near_end and not finish:
            break  # leave the end to the caller
        if near_end and not drop_last:
            h = _finish_split(slen, p, w, max_tokens, max_size, code, q, max_cost, cost_limited,
                              sizes[0], maxes[0])
            if h > 0:
                n_out = _write_deal(order, p, p + h, w, rot, out, n_out, counts[step], cur)
                step += 1
                if h < left:
                    rot = _below(rot_key, first_step + step, w) if shuffle else 0
                    n_out = _write_deal(order, p + h, n, w, rot, out, n_out, counts[step], cur)
                    step += 1
                p = n
                break
        if rates[best] == np.inf:
            if drop_last:
                break
            best = 3  # nothing completes a step nor fits in two: deal what fits, then go on
            ends[3] = p + w * b
        if best >= 3:
            n_out = _write_deal(order, p, ends[best], w, rot, out, n_out, counts[step], cur)
            p = ends[best]
        else:
            n_out, p = _write_contiguous(order, p, sizes[best], w, rot, out, n_out, counts[step], cur)
        step += 1
    return counts, step, n_out, p


@njit(cache=True)
def step_permutation(n_steps, key):
    """(n_steps,) int64 Fisher-Yates permutation drawn from ``key``."""
    perm = np.arange(n_steps)
    for i in range(n_steps - 1, 0, -1):
        j = _below(key, i, i + 1)
        t = perm[i]
        perm[i] = perm[j]
        perm[j] = t
    return perm
