"""Step layouts of the bucketed planner: contiguous batches, deals over the
ranks, their waste rate, and the split of the last samples into final steps."""

from __future__ import annotations

import numpy as np

from ..toolkit import _I64_MAX, _cost, _helper, _new, _over

# Weights of the waste terms when choosing a step's layout (``_waste_rate``),
# roughly inverse to the slack the targets leave each: balance 0.98, padding
# 0.97, budget use 0.9 (tempered, so that fill is not sacrificed wholesale).
_W_BALANCE = 1.25
_W_PADDING = 1.0
_W_FILL = 0.5
_NARROW = 20  # a narrow deal spans at most 1 + 1/_NARROW in length


@_helper
def _contiguous(slen, p, w, max_tokens, max_size, tab, ca, cb, limit, sizes, maxes, off):
    """W batches of consecutive samples from ``p``, each filled until the next
    sample would break the size cap, token budget, cost ``limit`` or the limit
    curve ``tab`` (``toolkit._over``: (0,) for none).

    Fills sizes/maxes[off:off + W]. Returns (end, complete, real tokens):
    complete is False when the data ran out before the W-th batch was closed
    by a limit.
    """
    n = slen.shape[0]
    pos = p
    real = 0
    for r in range(w):
        if pos >= n:
            return pos, False, real
        cnt = np.int64(1)
        mx = np.int64(slen[pos])
        real += mx
        pos += 1
        closed = False
        while pos < n:
            ln = np.int64(slen[pos])
            nm = ln if ln > mx else mx
            if (cnt + 1 > max_size or (cnt + 1) * nm > max_tokens or _cost(ca, cb, cnt + 1, nm) > limit
                    or _over(tab, cnt + 1, nm)):
                closed = True
                break
            cnt += 1
            mx = nm
            real += ln
            pos += 1
        sizes[off + r] = cnt
        maxes[off + r] = mx
        if not closed and r == w - 1:
            return pos, False, real
    return pos, True, real


@_helper
def _time_rate(slen, p, end, sizes, maxes, off, w, ca, cb):
    """Rank time per unit of work of the W batches sizes/maxes[off:off + W]
    of slen[p:end]: W x the costliest batch over what its samples cost alone
    (no padding, perfect balance), so 1 is ideal. inf when the samples cost
    nothing."""
    top = np.int64(0)
    for r in range(w):
        c = _cost(ca, cb, sizes[off + r], maxes[off + r])
        top = c if c > top else top
    work = 0.0
    for i in range(p, end):
        work += _cost(ca, cb, np.int64(1), np.int64(slen[i]))
    return w * float(top) / work if work > 0.0 else np.inf


@_helper
def _sparse_cap(slen, p, w, max_tokens, max_size, tab, ca, cb, top, lone, rate, sizes, maxes, off):
    """Where long samples are sparse (slen descending), a step of contiguous
    batches spans a wide range of lengths and its first batches cost far
    more than its last. Try holding every batch to a cost limit, from top
    (the costliest batch without one) down by 5 % at a time until it is
    below the longest sample alone (``lone``) or the data runs out, and
    keep the limit with the least ``_time_rate`` if below ``rate`` (the
    layout chosen so far's).

    sizes, maxes[off:off + 2W]: scratch; the chosen layout is left in the
    first W. Returns
    its end, or -1 when no limit does better.
    """
    best_end = np.int64(-1)
    limit = top
    while True:
        limit = limit - limit // 20 - 1
        if limit < lone:
            break
        end, complete, real = _contiguous(slen, p, w, max_tokens, max_size, tab, ca, cb, limit, sizes, maxes, off + w)
        if not complete:
            break
        r = _time_rate(slen, p, end, sizes, maxes, off + w, w, ca, cb)
        if r < rate:
            rate = r
            best_end = end
            for j in range(off, off + w):
                sizes[j] = sizes[j + w]
                maxes[j] = maxes[j + w]
    return best_end


@_helper
def _deal_size(slen, p, w, max_tokens, max_size, tab, ca, cb, max_cost):
    """How many samples per rank a deal of the samples from ``p`` can take.

    Returns (b, b_narrow, complete): b is the largest count such that the
    W * b samples from p, dealt over W ranks, fit the size cap, token budget
    and cost limit on every rank (each rank's longest is at most the segment's
    longest); b_narrow <= b the largest whose segment spans at most a factor
    1 + 1/_NARROW in length (0 if none); complete is False when the data
    bounded b. Needs p + W <= n. Works in either direction of slen.
    """
    n = slen.shape[0]
    mx = np.int64(0)
    mn = _I64_MAX
    for j in range(p, p + w):
        ln = np.int64(slen[j])
        mx = ln if ln > mx else mx
        mn = ln if ln < mn else mn
    b = np.int64(1)
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
            ln = np.int64(slen[j])
            nm = ln if ln > nm else nm
            mn = ln if ln < mn else mn
        if nb * nm > max_tokens or _cost(ca, cb, nb, nm) > max_cost or _over(tab, nb, nm):
            break
        b = nb
        mx = nm
        if b_narrow == b - 1 and mx * _NARROW <= mn * (_NARROW + 1):
            b_narrow = b
    return b, b_narrow, complete


@_helper
def _deal_rank(t, m, w):
    """Layout slot of the t-th longest of m dealt samples: rounds of W in
    slot order, except that a final partial round goes to the last slots,
    whose longest samples are the shortest."""
    j = t % w
    # (t >= m - m % W alone: it is false for every t < m when m % W == 0; a
    # separate m % W != 0 test would be loop-invariant, and unswitched.)
    if t >= m - m % w:
        return w - 1 - j
    return j


@_helper
def _deal_stats(slen, lo, hi, w, sizes, maxes, off):
    """Sizes and longest sample per slot of dealing slen[lo:hi] from its end
    (the longest, when slen ascends) into sizes/maxes[off:off + W]. Returns
    the real tokens."""
    m = hi - lo
    real = 0
    for r in range(off, off + w):
        sizes[r] = 0
        maxes[r] = 0
    for t in range(m):
        r = off + _deal_rank(t, m, w)
        ln = np.int64(slen[hi - 1 - t])
        real += ln
        sizes[r] += 1
        if ln > maxes[r]:
            maxes[r] = ln
    return real


@_helper
def _waste_rate(sizes, maxes, off, real, w, max_tokens, max_size, ca, cb, max_cost, cost_limited):
    """Weighted tokens wasted per real token of the W batches
    sizes/maxes[off:off + W], summing padding, straggler time
    (padded tokens x (1 - balance)) and the unused capacity of batches below
    their limit (budget, size cap or cost cap, whichever binds)."""
    padded = 0.0
    csum = 0.0
    cmax = 0.0
    unused = 0.0
    # Not ``if cost_limited`` in the loop: LLVM would unswitch the loop on
    # it (two copies of its body); a 0/1 factor compiles once, same values.
    by_cost = 1.0 if cost_limited else 0.0
    for r in range(off, off + w):
        tok = float(sizes[r] * maxes[r])
        c = float(_cost(ca, cb, sizes[r], maxes[r]))
        padded += tok
        csum += c
        cmax = c if c > cmax else cmax
        fill = tok / max_tokens
        by_size = sizes[r] / max_size
        fill = by_size if by_size > fill else fill
        by_cap = by_cost * c / max_cost  # 0 (<= fill) without a cost cap
        fill = by_cap if by_cap > fill else fill
        if 0.0 < fill < 1.0:
            unused += tok * (1.0 / fill - 1.0)
    balance = csum / (w * cmax) if cmax > 0.0 else 1.0
    waste = _W_BALANCE * padded * (1.0 - balance) + _W_PADDING * (padded - real) + _W_FILL * unused
    return waste / (float(real) if real > 1 else 1.0), balance


@_helper
def _fits(count, max_len, max_tokens, max_size, tab, ca, cb, max_cost):
    return count <= 1 or (count <= max_size and count * max_len <= max_tokens
                          and _cost(ca, cb, count, max_len) <= max_cost and not _over(tab, count, max_len))


@_helper
def _finish_split(slen, p, w, max_tokens, max_size, tab, ca, cb, max_cost, cost_limited, sizes, maxes):
    """Where to split the last samples slen[p:] (ascending by bucket) into at
    most two evenly dealt steps: returns h (the first step is slen[p:p+h],
    the second the rest; h = n - p for a single step), or -1 when no split
    fits the limits. Chooses the least total ``_waste_rate`` (weighted by
    real tokens), estimated cheaply: each step dealt evenly, every rank's
    longest taken as the step's longest."""
    n = slen.shape[0]
    m = n - p
    # Three arrays, not views of one: slices cost more to compile.
    pre = _new(m + 1)  # longest and total of the first i samples
    tot = _new(m + 1)
    suf = _new(m + 1)  # longest of slen[p+i:]
    pre[0] = 0
    tot[0] = 0
    for i in range(m):
        ln = np.int64(slen[p + i])
        pre[i + 1] = ln if ln > pre[i] else pre[i]
        tot[i + 1] = tot[i] + ln
    suf[m] = 0
    for i in range(m - 1, -1, -1):
        ln = np.int64(slen[p + i])
        suf[i] = ln if ln > suf[i + 1] else suf[i + 1]
    best = -1
    best_rate = np.inf
    h = m
    while h >= w:
        rest = m - h
        if rest == 0 or rest >= w:
            ba = (h + w - 1) // w
            bb = (rest + w - 1) // w
            if (_fits(ba, pre[h], max_tokens, max_size, tab, ca, cb, max_cost)
                    and (rest == 0 or _fits(bb, suf[h], max_tokens, max_size, tab, ca, cb, max_cost))):
                # The two steps in turn, written out here rather than in a
                # helper of their own: one function less to compile.
                rate = 0.0
                for part in range(1 if rest == 0 else 2):
                    cnt = h if part == 0 else rest
                    mx = pre[h] if part == 0 else suf[h]
                    real = tot[h] if part == 0 else tot[m] - tot[h]
                    for r in range(w):
                        sizes[r] = cnt // w + (1 if r < cnt % w else 0)
                        maxes[r] = mx
                    rate += _waste_rate(sizes, maxes, np.int64(0), real, w, max_tokens, max_size, ca, cb, max_cost,
                                        cost_limited)[0] * real
                if rate < best_rate:
                    best_rate = rate
                    best = h
        h = h - w if h % w == 0 else h - h % w
    return best


@_helper
def _write_deal(order, lo, hi, w, rot, out, at, counts, row, cur):
    """Deal order[lo:hi] as ``_deal_stats`` does; slot j goes to rank
    (j + rot) % W. Writes rank-major into out[at:], sizes into
    counts[row:row + W]; cur: (W,) scratch. Returns the new end of out."""
    m = hi - lo
    for r in range(w):
        counts[row + r] = 0
    for t in range(m):
        counts[row + (_deal_rank(t, m, w) + rot) % w] += 1
    acc = at
    for r in range(w):
        cur[r] = acc
        acc += counts[row + r]
    for t in range(m):
        r = (_deal_rank(t, m, w) + rot) % w
        out[cur[r]] = order[hi - 1 - t]
        cur[r] += 1
    return acc


@_helper
def _write_contiguous(order, p, sizes, off, w, rot, out, at, counts, row, cur):
    """Slot j's batch is the next sizes[off + j] samples from p; it goes to
    rank (j + rot) % W, its size to counts[row + rank]. Returns (new end of out, new p)."""
    for j in range(w):
        counts[row + (j + rot) % w] = sizes[off + j]
    acc = at
    for r in range(w):
        cur[r] = acc
        acc += counts[row + r]
    for j in range(w):
        r = (j + rot) % w
        at = cur[r]
        for i in range(sizes[off + j]):  # explicit loop: slice assignment compiles slowly
            out[at + i] = order[p + i]
        p += sizes[off + j]
    return acc, p
