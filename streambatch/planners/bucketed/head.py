"""The outlier head: when the longest remaining sample alone costs as much as
the cheapest full batch, it sets its step's time whatever the layout. The
head's batches are then held to that lone cost and grouped into steps by
cost, so no batch costs more than its step must."""

from __future__ import annotations

import numpy as np

from .common import _below, _helper, batch_cost


@_helper
def _grow_rows(counts, used, rows):
    """counts (k, W) copied into (max(rows, k), W) zeros, its first ``used`` rows kept."""
    grown = np.zeros((max(rows, counts.shape[0]), counts.shape[1]), dtype=np.int64)
    for i in range(used):  # explicit loops: Numba compiles slice assignment slowly
        for r in range(counts.shape[1]):
            grown[i, r] = counts[i, r]
    return grown


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
    sizes = np.empty(4 * w, dtype=np.int64)
    costs = np.empty(4 * w, dtype=np.int64)
    k = 0
    pos = p
    k_done = 0
    stop = p
    while pos < n:
        if k == sizes.shape[0]:
            sizes = _grow1(sizes, k)
            costs = _grow1(costs, k)
        cnt = 1
        mx = np.int64(slen[pos])
        pos += 1
        by_cost = False
        while pos < n:
            nm = max(mx, np.int64(slen[pos]))
            if cnt + 1 > max_size or (cnt + 1) * nm > max_tokens:
                break
            if batch_cost(code, q, cnt + 1, nm) > cap:
                by_cost = True
                break
            cnt += 1
            mx = nm
            pos += 1
        sizes[k] = cnt
        costs[k] = batch_cost(code, q, cnt, mx)
        k += 1
        if k % w == 0:
            took = pos - stop
            k_done = k
            stop = pos
            if not by_cost or n - pos < 2 * took:
                break
    return sizes, costs, k_done, stop


@_helper
def _grow1(a, used):
    grown = np.empty(2 * a.shape[0], dtype=np.int64)
    for i in range(used):
        grown[i] = a[i]
    return grown


@_helper
def _by_cost(costs, k):
    """(k,) int64 indices of costs[:k] from the costliest, ties in index
    order: a bottom-up merge sort (np.argsort compiles much more code)."""
    idx = np.arange(k)
    tmp = np.empty(k, dtype=np.int64)
    width = 1
    while width < k:
        for lo in range(0, k, 2 * width):
            mid = min(lo + width, k)
            hi = min(lo + 2 * width, k)
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
    return idx


@_helper
def _write_head(order, p, sizes, costs, k, w, shuffle, rot_key, first_step, out, n_out, counts, step):
    """Write the k head batches (consecutive runs of order[p:] of the given
    sizes) as k / W steps, the costliest W batches first: grouping batches
    of like cost makes every step as short as its batches allow (sorting
    minimises the sum over steps of the costliest batch). Returns (n_out, step)."""
    start = np.empty(k, dtype=np.int64)
    acc = p
    for i in range(k):
        start[i] = acc
        acc += sizes[i]
    rank_of = _by_cost(costs, k)
    for g in range(k // w):
        rot = _below(rot_key, first_step + step, w) if shuffle else 0
        for j in range(w):
            counts[step, (j + rot) % w] = sizes[rank_of[g * w + j]]
        for r in range(w):
            b = rank_of[g * w + (r - rot) % w]
            for i in range(sizes[b]):
                out[n_out + i] = order[start[b] + i]
            n_out += sizes[b]
        step += 1
    return n_out, step
