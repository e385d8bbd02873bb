"""Numba kernel of packed (padding-free) planning: samples counting-sorted
into length buckets, then every global step's W bins filled best-fit, the
least costly bin served first.

Arrays and integer scalars in, arrays out; the plan layer (``packed.py``)
validates and prepares the input. A packed batch's integer cost is the sum
of its samples' ``L * (ca * L + cb)`` (``CostModel.coefficients``): there is
no padding, so a sample costs the same in any batch.

The hot loop (bucket search, union-find, heap) is written out in
``pack_plan`` rather than in helpers: an array handed to a helper, called or
inlined by Numba (``inline="always"``), costs an atomic NRT reference count
increment and decrement per array per call, which LLVM cannot remove here.
With the search's eight arrays that was most of the loop's time (perf: 46 %
of the samples in ``NRT_incref``/``NRT_decref``); written out, the kernel
plans the same batches in about half the time (``streambatch bench --sizes 1e6 1e7
--worlds 8 64 --planners bucketed --pack``).
"""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..toolkit import _I64_MAX, _below, _grow, _helper, _mix, _new
from .sort import _TAGS, _histograms, _scatter_by_bucket, _scatter_by_tag

SCAN = 8  # samples of a bucket a bin looks through for one that fits (the bucket search in ``pack_plan``)


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
    # 2. bucket bookkeeping: nxt[b] back at each segment's start; a union-find over the nonempty buckets,
    # ``link[x] == x`` while bucket x - 1 is nonempty (slot 0: the 'none' sentinel), so that the largest
    # nonempty bucket <= b is found from x = b + 1 by following link (path halving keeps it near O(1))
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
            bin_ = np.uint64(heap[0])  # unsigned: no wraparound on its arrays (see the heap below)
            bk = np.int64(-1)
            if cnt[bin_] == 0:
                bk = high
            elif cnt[bin_] < max_size:
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
                probe = room
                if spread and room >= 0 and max_size - c > 1:
                    if float(max_tokens) * rem >= float(max_size) * lt:
                        keep = room - (max_size - c - 1) * np.int64(slen[nxt[low]])
                        if keep >= 0:
                            probe = keep
                    elif (float(room) * rem < float(max_size - c) * lt and tok[bin_] * rem > c * lt
                          and float(max_tokens) * rem > (c + 1) * lt):
                        slots = min(float(max_size - c), max_tokens * rem / lt - c)
                        probe = np.int64(room / slots)
                # The longest nonempty bucket whose next sample fits probe (>= 0), or -1: at probe, then (if
                # that was a narrower probe and nothing fits it) at the room itself. Written out here, not a
                # helper: an array passed to a helper costs NRT reference counts on every call.
                while probe >= 0:
                    # the bucket probe falls in (it may pass the longest sample, and the lookup table)
                    if probe >= edges[k - 1]:
                        rb = np.int64(k)
                    elif probe < table.shape[0]:
                        rb = np.int64(table[probe])
                    else:
                        lo = 0
                        hi = k
                        while lo < hi:  # number of edges <= probe
                            mid = (lo + hi) >> 1
                            if edges[mid] <= probe:
                                lo = mid + 1
                            else:
                                hi = mid
                        rb = np.int64(lo)
                    if rb >= high:  # high: the longest nonempty bucket
                        bk = high
                    else:  # the largest nonempty bucket <= rb, by the union-find
                        x = rb + 1
                        while link[x] != x:
                            link[x] = link[link[x]]
                            x = link[x]
                        bk = x - 1
                    if bk >= 0 and bk == rb and np.int64(slen[nxt[bk]]) > probe:
                        p = nxt[bk]
                        end = start[bk] + size[bk]
                        stop = p + SCAN if p + SCAN < end else end
                        found = False
                        for q in range(p + 1, stop):
                            if np.int64(slen[q]) <= probe:
                                t = slen[q]
                                slen[q] = slen[p]
                                slen[p] = t
                                u = order[q]
                                order[q] = order[p]
                                order[p] = u
                                found = True
                                break
                        if not found:  # none of them fits: the buckets below all do
                            x = rb
                            while link[x] != x:
                                link[x] = link[link[x]]
                                x = link[x]
                            bk = x - 1
                    if bk >= 0 or probe == room:
                        break
                    probe = room
                if curved and bk >= 0:
                    # a sample longer than the bin's longest moves the curve's limit down: recheck
                    nl = np.int64(slen[nxt[bk]])
                    if nl > mxl[bin_] and tok[bin_] + nl > ttab[nl]:
                        bk = -1
            if bk < 0:  # nothing fits: the bin is closed, the last of the heap takes its place
                hs -= 1
                heap[0] = heap[hs]
                hc[0] = hc[hs]
            else:
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
            # Restore the heap below the root: heap holds the open bins, hc their costs (a copy beside them:
            # the child to follow is chosen without a branch); the least costly bin at the root, ties to fewer
            # tokens, then fewer samples, then the lower index.
            # (Unsigned positions: Numba adds no negative-index wraparound to each access, 12 % of the loop.)
            i = np.uint64(0)
            one = np.uint64(1)
            hsu = np.uint64(hs)
            xb = heap[0]
            cx = hc[0]
            while True:
                ch = i + i + one
                if ch >= hsu:
                    break
                if ch + one < hsu:
                    av = hc[ch]
                    bv = hc[ch + one]
                    right = bv < av
                    if bv == av:  # rare but for empty bins: the full order
                        r1 = heap[ch + one]
                        r0 = heap[ch]
                        right = (tok[r1] < tok[r0] if tok[r1] != tok[r0] else
                                 cnt[r1] < cnt[r0] if cnt[r1] != cnt[r0] else r1 < r0)
                    ch += np.uint64(right)
                y = hc[ch]
                if y > cx:
                    break
                if y == cx:
                    yb = heap[ch]
                    if not (tok[yb] < tok[xb] if tok[yb] != tok[xb] else
                            cnt[yb] < cnt[xb] if cnt[yb] != cnt[xb] else yb < xb):
                        break
                heap[i] = heap[ch]
                hc[i] = y
                i = ch
            heap[i] = xb
            hc[i] = cx
        if remaining == 0 and hs > 0:
            complete = False
        if (step + 1) * w > counts.shape[0]:
            counts = _grow(counts, step * w, 2 * counts.shape[0])
        rot = _below(rot_key, step, w) if shuffle else 0
        acc = n_out
        for r in range(w):  # bin r goes to rank (r + rot) % W (0 <= r + rot < 2W: no division)
            counts[step * w + (r + rot if r + rot < w else r + rot - w)] = cnt[r]
        # each bin's batch starts after those of the ranks before its own: cursor by bin, not rank
        for q in range(w):
            r = q - rot if q >= rot else q - rot + w  # the bin rank q holds
            cursor[r] = acc
            acc += cnt[r]
        for t in range(placed):
            b = step_bin[t]
            out[cursor[b]] = step_pos[t]
            cursor[b] += 1
        n_out += placed
        step += 1
    return counts, step, complete
