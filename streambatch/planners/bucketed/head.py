"""The head: long samples (slen descending) laid out one step at a time,
each step no longer than its longest sample makes it.

An outlier (the longest remaining sample alone costs as much as the
cheapest full batch) sets its step's time whatever the layout. The next
samples are then cut into a pool of batches, each held to the cost of the
longest sample alone, and the step takes the W costliest of them: no batch
costs more than the step must (outliers alone, or with samples that keep
it under that cost), the other ranks get batches as close to that cost as
the pool offers, and the rest goes back, in order, to be planned next. The
steps after a head step stay head steps while the samples stay long (the
pool re-cut each time under the new longest sample's cost), so that the
longest samples are spread over steps of like cost.
"""

from __future__ import annotations

import numpy as np

from ..toolkit import _cost, _helper, _new, _over, _zeros

LONG = 16  # a sample is long when fewer than this many of its length fit the token budget
POOL = 4  # the pool holds at most this many steps' worth of batches...
_MIN_POOL = 2  # ...and at least this many, so that a step has batches to choose from
_SWAP = 1.15  # a lone sample within 1 / _SWAP of the cheapest chosen batch's cost is taken instead


@_helper
def _head_pool(slen, p, w, max_tokens, max_size, tab, ca, cb, cap, long_only, sizes, costs):
    """Cut slen[p:] into batches of consecutive samples, each filled until
    the next sample would break the size cap, token budget, cost ``cap`` or
    the limit curve ``tab`` ((0,): none).

    Stops after a whole number of steps' worth of batches (W), at
    _MIN_POOL of them or more once the last batch costs under cap / 2
    (shorter samples no longer compete), at POOL at most; with
    ``long_only``, before the first batch of samples that are not long
    (LONG). sizes, costs: (POOL * W,) int64 receive the batches. Returns k,
    a multiple of W: the pool is the first k batches (0 when the data ran
    out first).
    """
    n = slen.shape[0]
    pos = p
    k = np.int64(0)
    while pos < n and k < POOL * w and (max_tokens < LONG * np.int64(slen[pos]) or not long_only):
        cnt = np.int64(1)
        mx = np.int64(slen[pos])
        pos += 1
        while pos < n:
            ln = np.int64(slen[pos])
            nm = ln if ln > mx else mx
            if (cnt + 1 > max_size or (cnt + 1) * nm > max_tokens or _cost(ca, cb, cnt + 1, nm) > cap
                    or _over(tab, cnt + 1, nm)):
                break
            cnt += 1
            mx = nm
            pos += 1
        sizes[k] = cnt
        costs[k] = _cost(ca, cb, cnt, mx)
        k += 1
        if k % w == 0 and k >= _MIN_POOL * w and 2 * costs[k - 1] < cap:
            break
    return k - k % w


@_helper
def _take_head(order, slen, p, w, sizes, costs, k, chosen):
    """Take the W costliest of the k pool batches (consecutive runs of
    order/slen[p:] of the given sizes; ties: the first) as one step: they
    are moved, in pool order, to the front of order/slen[p:], the other pool
    samples after them in their order (so slen[p + used:] stays
    descending). chosen: (W,) receives their sizes. Returns used, the
    samples they hold."""
    mark = _zeros(k)
    low = 0  # the cheapest chosen batch
    for _ in range(w):  # W passes over at most POOL * W batches: simpler than sorting
        top = -1
        for b in range(k):
            if mark[b] == 0 and (top < 0 or costs[b] > costs[top]):
                top = b
        mark[top] = 1
        low = top
    # A lone sample left out would set the next step's time (the longest
    # left) with nothing as costly beside it, while a batch of several long
    # samples can be re-cut to fit a later step: while the longest sample
    # left out is alone in its batch, costs nearly as much as the cheapest
    # chosen batch and too few left-out batches cost nearly as much as it
    # (to share the next step with it), it replaces the cheapest chosen
    # batch of several long samples.
    bar = costs[low]
    for b in range(k):
        if mark[b] == 1:
            continue
        if sizes[b] != 1 or _SWAP * costs[b] < bar:
            break
        peers = 0
        out = -1
        for j in range(k):
            if mark[j] == 0:
                peers += _SWAP * costs[j] >= costs[b]
            elif 1 < sizes[j] < LONG and (out < 0 or costs[j] <= costs[out]):
                out = j
        if 4 * peers >= w or out < 0:
            break
        mark[out] = 0
        mark[b] = 1
    span = 0
    used = 0
    for b in range(k):
        span += sizes[b]
        used += mark[b] * sizes[b]
    # One pass, chosen batches to buf[:used] and the others after them (not
    # a pass for each: LLVM unrolls a two-round loop into two copies).
    buf = _new(2 * span)
    to_chosen = 0
    to_other = used
    j = 0
    start = p
    for b in range(k):
        at = to_chosen if mark[b] == 1 else to_other
        for i in range(start, start + sizes[b]):
            buf[at] = order[i]
            buf[span + at] = slen[i]
            at += 1
        if mark[b] == 1:
            chosen[j] = sizes[b]
            j += 1
            to_chosen = at
        else:
            to_other = at
        start += sizes[b]
    for i in range(span):
        order[p + i] = buf[i]
        slen[p + i] = buf[span + i]
    return used
