"""Numba kernel of packed (padding-free) planning: samples counting-sorted
into length buckets, then every global step's W bins filled best-fit, the
least costly bin served first.

Arrays and integer scalars in, arrays out; the plan layer (``packed.py``)
validates and prepares the input. A packed batch's integer cost is the sum
of its samples' ``L * (ca * L + cb)`` (``CostModel.coefficients``): there is
no padding, so a sample costs the same in any batch.
"""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..toolkit import _I64_MAX, _below, _grow, _helper, _inline, _mix, _new
from .sort import _TAGS, _histograms, _scatter_by_bucket, _scatter_by_tag

SCAN = 8  # samples of a bucket a bin looks through for one that fits (``_fitting``)


@_inline
def _top(link, b):
    """The largest nonempty bucket <= b, or -1 (a union-find over buckets:
    ``link[x] == x`` while bucket x - 1 is nonempty; slot 0 is the 'none'
    sentinel). Path halving keeps every call near O(1)."""
    x = b + 1
    while link[x] != x:
        link[x] = link[link[x]]
        x = link[x]
    return x - 1


@_inline
def _bucket_at(length, edges, table):
    """The bucket of ``length`` (int64 >= 0), which may pass the longest sample (and the lookup table)."""
    k = edges.shape[0]
    if length >= edges[k - 1]:
        return np.int64(k)
    if length < table.shape[0]:
        return np.int64(table[length])
    lo = 0
    hi = k
    while lo < hi:  # number of edges <= length
        mid = (lo + hi) >> 1
        if edges[mid] <= length:
            lo = mid + 1
        else:
            hi = mid
    return np.int64(lo)


@_inline
def _fitting(room, link, high, nxt, start, size, slen, order, edges, table):
    """The longest nonempty bucket whose next sample fits ``room`` (>= 0), or
    -1. In the bucket that ``room`` falls in, the first of its next SCAN
    samples that fits is swapped to the front (best fit to within a sample
    rather than a bucket: 0.7 % fewer batches where two or three samples
    fill a batch)."""
    rb = _bucket_at(room, edges, table)
    bk = high if rb >= high else _top(link, rb)  # high: the longest nonempty bucket
    if bk >= 0 and bk == rb and np.int64(slen[nxt[bk]]) > room:
        p = nxt[bk]
        end = start[bk] + size[bk]
        stop = p + SCAN if p + SCAN < end else end
        for q in range(p + 1, stop):
            if np.int64(slen[q]) <= room:
                t = slen[q]
                slen[q] = slen[p]
                slen[p] = t
                u = order[q]
                order[q] = order[p]
                order[p] = u
                return bk
        bk = _top(link, rb - 1)  # none of them fits: the buckets below all do
    return bk


@_helper
def _longest_within(ca, cb, budget, hi):
    """The largest L in [0, hi] with ``L * (ca * L + cb) <= budget`` (cost is
    increasing in L), or -1 when budget < 0. Compares by division so that no
    product can overflow."""
    if budget < 0:
        return np.int64(-1)
    lo = np.int64(0)
    while lo < hi:
        mid = hi - (hi - lo) // 2  # upper middle: lo < mid <= hi
        if mid <= budget // (ca * mid + cb):
            lo = mid
        else:
            hi = mid - 1
    return lo


@_helper
def _lighter(cost, tok, cnt, r, b):
    """Bin r is served before bin b: less cost, then fewer tokens, then fewer samples, then lower index."""
    if cost[r] != cost[b]:
        return cost[r] < cost[b]
    if tok[r] != tok[b]:
        return tok[r] < tok[b]
    if cnt[r] != cnt[b]:
        return cnt[r] < cnt[b]
    return r < b


@_inline
def _sift_down(heap, hc, size, i, cost, tok, cnt):
    """Restore the heap below position i: heap holds bin ids, hc their costs
    (a copy beside them: the child to follow is chosen without a branch);
    the least costly bin at the root, in ``_lighter``'s order."""
    x = heap[i]
    cx = hc[i]
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size:
            a = hc[c]
            b = hc[c + 1]
            right = b < a
            if b == a:  # rare but for empty bins: the full order
                right = _lighter(cost, tok, cnt, heap[c + 1], heap[c])
            c += np.int64(right)
        y = hc[c]
        if y > cx or (y == cx and not _lighter(cost, tok, cnt, heap[c], x)):
            break
        heap[i] = heap[c]
        hc[i] = y
        i = c
    heap[i] = x
    hc[i] = cx


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def pack_plan(lengths, edges, table, key, shuffle, w, max_tokens, max_size, ttab, ca, cb, max_cost, spread, order,
              slen, out, scratch):
    """Plan packed steps of W bins.

    lengths: (n,) int64 >= 0. edges: (k,) int64 bucket edges, table: lookup
    table or (0,) (as ``bucketed.sort.bucket_sort``). key: uint64, the
    epoch's draws. max_tokens, max_size >= 1, max_cost >= 1 (int64 max for no
    cap); ttab: (> max length,) int64 the limit curve as the most tokens a bin
    whose longest sample is L may hold (``BatchConstraint.token_table``), or
    (0,): none (a bin's room is then measured from its running longest, and a
    sample longer than it that would break the curve closes the bin); ca, cb:
    the cost model's coefficients. order, slen, scratch: (n,)
    scratch of the index dtype, the length dtype, the length dtype; out:
    (n + W,) of the index dtype, receives the plan's samples grouped by step
    and rank.

    1. Samples are counting-sorted into their length buckets, ascending,
       in random order inside each bucket (one radix pass over random tags,
       as the bucketed planner's sort), so near-equal lengths trade places
       from epoch to epoch.
    2. Each step opens W empty bins and serves the least costly open one
       (ties: fewer tokens, fewer samples, lower index; a binary heap) until
       every bin is closed: an empty bin takes the next sample of the longest
       bucket left, whatever its length (a sample over the budget or cost cap
       is a batch of its own); any other bin takes the next sample of the
       longest bucket whose samples fit its room (its token room, its cost
       cap's, and, when its size cap would bind first, the room its other
       free slots leave for the shortest samples left), and is closed when
       none fits or it holds ``max_size``. So every step starts with the W
       longest samples left, the least costly bin keeps taking the longest
       that fit (costs stay within about one sample's cost of each other),
       rooms are filled with ever shorter samples (bins close nearly full).
       With ``spread`` (where the size cap would bind: many short samples),
       a bin tracks the mean length left (see the comment in the loop), so
       the short samples are shared out instead of left to bins that fill
       their slots long before their tokens.
    3. Bin j of step s goes to rank (j + rot) % W, rot drawn from (key, s).

    Returns (counts, n_steps, complete): counts[:n_steps * W] (int64) the
    batch sizes, step-major, by rank; complete is False when the data ran out
    while a bin of the final step was still open (the final step is then
    partial: some batches may be empty when fewer than W samples were left).
    """
    n = lengths.shape[0]
    k = edges.shape[0]
    nb = k + 1
    # 1. the bucket sort (out[:n] and scratch are its temporaries)
    size = _new(nb)
    start = _new(nb)
    tags = _new(_TAGS + 1)
    for b in range(nb):
        size[b] = 0
    for t in range(_TAGS + 1):
        tags[t] = 0
    b = 0
    for v in range(table.shape[0]):
        while b < k and edges[b] <= v:
            b += 1
        table[v] = b
    _histograms(lengths, edges, table, _mix(key, np.uint64(1)), shuffle, size, tags)
    for t in range(_TAGS):
        tags[t + 1] += tags[t]
    _scatter_by_tag(lengths, _mix(key, np.uint64(1)), shuffle, tags, out, scratch)
    acc = np.int64(0)
    for b in range(nb):
        start[b] = acc
        acc += size[b]
    nxt = _new(nb)  # next unplaced position of bucket b (its segment ends at start[b] + size[b])
    for b in range(nb):
        nxt[b] = start[b]
    _scatter_by_bucket(out, scratch, edges, table, nxt, order, slen)
    # 2. bucket bookkeeping: nxt[b] back at each segment's start; a union-find over the nonempty buckets
    link = _new(nb + 1)
    for x in range(nb + 1):
        link[x] = x
    low = np.int64(nb)  # the lowest nonempty bucket
    high = np.int64(-1)  # the highest
    for b in range(nb):
        nxt[b] = start[b]
        if size[b] == 0:
            link[b + 1] = b
        else:
            high = b
            if low == nb:
                low = b
    counts = _new((n // (w * 16) + 4) * w)  # grown as needed: steps hold about a budget's worth each
    cost = _new(w)
    tok = _new(w)
    cnt = _new(w)
    mxl = _new(w)  # each bin's longest sample (the limit curve's length)
    curved = ttab.shape[0] > 0
    heap = _new(w)
    hc = _new(w)
    cursor = _new(w)
    buf = min(w * max_size, n) + w
    step_pos = _new(buf)
    step_bin = _new(buf)
    rot_key = _mix(key, np.uint64(2))
    capped = max_cost < _I64_MAX
    remaining = n
    left_tokens = np.int64(0)
    for i in range(n):
        left_tokens += np.int64(slen[i])
    n_out = np.int64(0)
    step = np.int64(0)
    complete = True
    while remaining > 0:
        for r in range(w):
            cost[r] = 0
            tok[r] = 0
            cnt[r] = 0
            mxl[r] = 0
            heap[r] = r
            hc[r] = 0
        hs = w
        placed = 0
        while hs > 0 and remaining > 0:
            bin_ = heap[0]
            if cnt[bin_] == 0:
                bk = high
            else:
                bk = -1
                if cnt[bin_] < max_size:
                    room = (ttab[mxl[bin_]] if curved else max_tokens) - tok[bin_]
                    if capped and room >= 0:
                        within = _longest_within(ca, cb, max_cost - cost[bin_], room)
                        room = within if within < room else room
                    # Sharing out the short samples (``spread``). Best fit alone would leave them to the last
                    # bins, which fill their slots long before their tokens where the size cap binds.
                    # - Count-bound (the mean length left at most budget / size cap: every bin should fill
                    #   its slots): a bin keeps room for its other free slots at the shortest length left,
                    #   taking the longest sample that leaves it.
                    # - Otherwise, mean tracking: a bin whose samples so far are longer on average than those
                    #   left takes the longest sample of at most its room per target slot, the target being
                    #   the samples a bin of the mean length left holds (budget / that mean, at most the
                    #   cap), while it has more than one such slot: every bin holds its share of shorter
                    #   samples, ending with its tokens near the budget and its count near the target.
                    # (Products, not quotients, in the tests: no division on the common path.)
                    c = cnt[bin_]
                    rem = float(remaining)
                    lt = float(left_tokens)
                    if spread and room >= 0 and max_size - c > 1:
                        if float(max_tokens) * rem >= float(max_size) * lt:
                            keep = room - (max_size - c - 1) * np.int64(slen[nxt[low]])
                            if keep >= 0:
                                bk = _fitting(keep, link, high, nxt, start, size, slen, order, edges, table)
                        elif (float(room) * rem < float(max_size - c) * lt and tok[bin_] * rem > c * lt
                              and float(max_tokens) * rem > (c + 1) * lt):
                            slots = min(float(max_size - c), max_tokens * rem / lt - c)
                            bk = _fitting(np.int64(room / slots), link, high, nxt, start, size, slen, order, edges,
                                          table)
                    if bk < 0 and room >= 0:
                        bk = _fitting(room, link, high, nxt, start, size, slen, order, edges, table)
                    if curved and bk >= 0:
                        # a sample longer than the bin's longest moves the curve's limit down: recheck
                        nl = np.int64(slen[nxt[bk]])
                        if nl > mxl[bin_] and tok[bin_] + nl > ttab[nl]:
                            bk = -1
                if bk < 0:  # nothing fits: the bin is closed
                    hs -= 1
                    heap[0] = heap[hs]
                    hc[0] = hc[hs]
                    _sift_down(heap, hc, hs, 0, cost, tok, cnt)
                    continue
            j = nxt[bk]
            nxt[bk] = j + 1
            if j + 1 == start[bk] + size[bk]:  # the bucket is empty now
                link[bk + 1] = bk
                while high >= 0 and nxt[high] == start[high] + size[high]:
                    high -= 1
                while low < nb and nxt[low] == start[low] + size[low]:
                    low += 1
            ln = np.int64(slen[j])
            remaining -= 1
            left_tokens -= ln
            cost[bin_] += ln * (ca * ln + cb)
            tok[bin_] += ln
            cnt[bin_] += 1
            mxl[bin_] = ln if ln > mxl[bin_] else mxl[bin_]
            step_pos[placed] = order[j]  # the sample itself: the scatter below reads it in order
            step_bin[placed] = bin_
            placed += 1
            hc[0] = cost[bin_]
            _sift_down(heap, hc, hs, 0, cost, tok, cnt)
        if remaining == 0 and hs > 0:
            complete = False
        if (step + 1) * w > counts.shape[0]:
            counts = _grow(counts, step * w, 2 * counts.shape[0])
        rot = _below(rot_key, step, w) if shuffle else 0
        acc = n_out
        for r in range(w):  # bin r goes to rank (r + rot) % W
            counts[step * w + (r + rot) % w] = cnt[r]
        for r in range(w):
            cursor[r] = acc
            acc += counts[step * w + r]
        for t in range(placed):
            r = (step_bin[t] + rot) % w
            out[cursor[r]] = step_pos[t]
            cursor[r] += 1
        n_out += placed
        step += 1
    return counts, step, complete
