"""The outlier head: when the longest remaining sample alone costs as much as
the cheapest full batch, it sets its step's time whatever the layout. The
head's batches are then held to that lone cost and grouped into steps by
cost, so no batch costs more than its step must."""

from __future__ import annotations

import numpy as np

from .common import _below, _cost, _grow, _helper, _new


@_helper
def _head_batches(slen, p, w, max_tokens, max_size, code, q, cap):
    """Batches of the long head of descending lengths slen[p:], each of
    consecutive samples filled until the next would break the size cap,
    token budget or cost ``cap`` (the cost of the longest sample alone).

    The head ends at a whole number of steps, once a step's last batch was
    closed by the token budget or size cap rather than by ``cap`` (ordinary
    steps follow), or once less data remains than two steps of it took (left
    to the caller).

    Returns (sizes, costs, k, stop): the first k batches (k a multiple of W,
    0 if the data ran out first) hold slen[p:stop].
    """
    n = slen.shape[0]
    sizes = _new(4 * w)
    costs = _new(4 * w)
    k = np.int64(0)
    pos = p
    k_done = np.int64(0)
    stop = p
    while pos < n:
        if k == sizes.shape[0]:
            sizes = _grow(sizes, k, 2 * k)
            costs = _grow(costs, k, 2 * k)
        cnt = np.int64(1)
        mx = np.int64(slen[pos])
        pos += 1
        by_cost = False
        while pos < n:
            ln = np.int64(slen[pos])
            nm = ln if ln > mx else mx
            if cnt + 1 > max_size or (cnt + 1) * nm > max_tokens:
                break
            if _cost(code, q, cnt + 1, nm) > cap:
                by_cost = True
                break
            cnt += 1
            mx = nm
            pos += 1
        sizes[k] = cnt
        costs[k] = _cost(code, q, cnt, mx)
        k += 1
        if k % w == 0:
            took = pos - stop
            k_done = k
            stop = pos
            if not by_cost or n - pos < 2 * took:
                break
    return sizes, costs, k_done, stop


@_helper
def _by_cost(costs, k, idx, tmp):
    """Fill idx (k,) with the indices of costs[:k] from the costliest, ties
    in index order: a bottom-up merge sort (np.argsort compiles much more
    code). tmp: (k,) scratch."""
    for i in range(k):
        idx[i] = i
    width = 1
    while width < k:
        for lo in range(0, k, 2 * width):
            mid = lo + width if lo + width < k else k
            hi = lo + 2 * width if lo + 2 * width < k else k
            i = lo
            j = mid
            for t in range(lo, hi):
                if i < mid and (j >= hi or costs[idx[i]] >= costs[idx[j]]):
                    tmp[t] = idx[i]
                    i += 1
                else:
                    tmp[t] = idx[j]
                    j += 1
        for t in range(k):
            idx[t] = tmp[t]
        width *= 2


@_helper
def _write_head(order, p, sizes, costs, k, w, shuffle, rot_key, first_step, out, n_out, counts, step):
    """Write the k head batches (consecutive runs of order[p:] of the given
    sizes) as k / W steps, the costliest W batches first: grouping batches
    of like cost makes every step as short as its batches allow (sorting
    minimises the sum over steps of the costliest batch). counts: flat
    (rows * W,) batch sizes, row ``step`` on. Returns (n_out, step)."""
    work = _new(3 * k)
    start = work[:k]
    rank_of = work[k : 2 * k]
    _by_cost(costs, k, rank_of, work[2 * k :])
    acc = p
    for i in range(k):
        start[i] = acc
        acc += sizes[i]
    for g in range(k // w):
        rot = _below(rot_key, first_step + step, w) if shuffle else 0
        for j in range(w):
            counts[step * w + (j + rot) % w] = sizes[rank_of[g * w + j]]
        for r in range(w):
            b = rank_of[g * w + (r - rot) % w]
            for i in range(sizes[b]):
                out[n_out + i] = order[start[b] + i]
            n_out += sizes[b]
        step += 1
    return n_out, step
