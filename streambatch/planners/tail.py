"""What ``drop_last`` leaves out of an epoch (plan layer, numpy): only what cannot give every rank a non-empty
batch within the step limit, and that rotated from epoch to epoch, so that no sample goes untrained over a few
epochs.

In a streamed window before the epoch's last, ``drop_last``'s leftover is carried into the next window
(``BatchConstraint.carry``) and planned there: nothing here applies. Otherwise it is lost for the epoch, and
a bounded planner plans the epoch with ``epoch_drop_last``:

1. the epoch is planned without ``drop_last``; when that plan is within the step limit of the ``drop_last``
   plan (``constraint.step_limit`` of its fewest steps) and needs no padding, it is the plan: nothing is
   left out. (Before, the packed planner dropped its partial final step every epoch, and that step held the
   corpus's shortest clips: LibriSpeech clean-100 at W = 64 trained 2,089 of its 28,539 clips in none of 5
   epochs; the padded planner dropped a whole epoch of 10 samples at W = 2 that fit one batch.)
2. it needs padding (its final step holds fewer than W samples): each padded batch takes instead the last
   sample of a batch holding two or more, from the plan's last step backwards (``unpad``: a batch losing a
   sample stays within every limit, a lone sample is always a valid batch): nothing is left out;
3. over the limit, or too few batches hold two samples (nearly every batch a lone sample: a size cap of 1,
   samples over half the budget): the epoch is planned with ``drop_last`` (or, where that leaves out more,
   the plan of step 1 without its padded final step) and r samples are left out, but which ones rotates
   (``rotate``): the samples come in the order of a permutation fixed by the seed, shifted by ``epoch * r``;
   a left-out sample met stays out, a planned one takes a left-out sample in its place where its batch still
   fits the rule (of those that fit, the one the cycle meets last; the batch check is monotone in the
   sample's length, so those that fit are found by bisection) and goes out instead, until r are out. Each
   epoch so leaves out the next samples of that cycle, not the same ones.

Without shuffling nothing rotates (a plan does not depend on seed or epoch). The seed-exact greedy planner
keeps the seed's rule (its final step is dropped when a rank's batch is empty; its shuffled order rotates what
that step holds).

Stream: (none) plans in, a plan out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..core.constraint import BatchConstraint
from ..core.plan import Plan

SCAN_PER_SAMPLE, SCAN_MIN = 64, 1024  # planned positions ``rotate`` tries: per left-out sample, and at least


def epoch_drop_last(lengths: np.ndarray, constraint: BatchConstraint, plan: Callable[[bool, int | None], Plan],
                    rotation: tuple[int, int] | None) -> Plan:
    """An epoch's plan with ``drop_last`` (steps 1-3 of the module docstring).

    lengths: (N,) int64, the plan's; constraint: the batch rule bound to them (not ``carry``);
    plan(drop_last, step_cap) -> Plan: the planner on them within ``step_cap`` steps where it can (None: the
    constraint's own limit); rotation: (a key of the seed alone, epoch), None without
    shuffling. The plan reports the fewest steps of the ``drop_last`` rule."""
    bound = constraint.step_bound(lengths, True)
    limit = constraint.step_limit(bound.steps)
    full = plan(False, limit)
    within = limit is None or full.num_steps <= limit
    if within:
        kept = full if full.num_padded == 0 else unpad(full)
        if kept is not None:
            return dataclasses.replace(kept, fewest_steps=bound.steps, fewest_exact=bound.exact)
    dropped = plan(True, constraint.step_cap)
    if within and full.num_steps > 1:  # or the plan without its padded final step, if that leaves out fewer
        cut = without_last_step(full)
        if cut is not None and cut.num_dropped < dropped.num_dropped:
            dropped = dataclasses.replace(cut, fewest_steps=dropped.fewest_steps, fewest_exact=dropped.fewest_exact)
    if rotation is None or not dropped.num_dropped or not dropped.num_steps:
        return dropped
    return rotate(dropped, lengths, constraint, rotation)


def without_last_step(plan: Plan) -> Plan | None:
    """A padded plan with its last planned step (the padded one) left out: its samples that no earlier step
    holds (each once) become the leftover. None where the steps before it still repeat a sample (a planner
    that moved a padding repeat out of the final step, as the shard-affine planner's swaps to holders may):
    that cut would train a sample twice."""
    w, k = plan.world_size, plan.num_steps
    end = int(plan.offsets[(k - 1) * w])
    kept = plan.samples[:end]
    if np.unique(kept).shape[0] != kept.shape[0]:
        return None
    # a repeat in the final step of a sample an earlier step holds is padding, not a sample left out
    left = np.setdiff1d(np.unique(plan.samples[end:]), kept)
    order = plan.step_order[plan.step_order != k - 1]
    return dataclasses.replace(plan, samples=plan.samples[:end], offsets=plan.offsets[: (k - 1) * w + 1],
                               step_order=order, num_padded=0, num_dropped=int(left.shape[0]), leftover=left)


def unpad(plan: Plan) -> Plan | None:
    """The plan with each padded batch (a lone repeat in the final planned step, ``finish_last_step``) holding
    instead the last sample of a batch of two or more, from the last planned step backwards; None when fewer
    batches hold two than there are padded ones."""
    w, k = plan.world_size, plan.num_steps
    flat = np.diff(plan.offsets)
    spare = np.maximum(flat - 1, 0)[::-1]  # batches from the plan's last backwards
    run = np.cumsum(spare)
    need = plan.num_padded
    if k == 0 or run[-1] < need:
        return None
    samples = plan.samples.copy()
    offsets = plan.offsets
    # the padded slots: lone batches of the final step repeating a sample of that step
    first = int(offsets[(k - 1) * w])
    values, times = np.unique(samples[first:], return_counts=True)
    repeats = dict(zip(values[times > 1].tolist(), (times[times > 1] - 1).tolist()))
    slots = []
    for b in range(k * w - 1, (k - 1) * w - 1, -1):
        v = int(samples[offsets[b]])
        if flat[b] == 1 and repeats.get(v, 0) > 0:
            slots.append(int(offsets[b]))
            repeats[v] -= 1
    if len(slots) != need:  # not the padding rule's plan: leave it
        return None
    j = int(np.searchsorted(run, need))
    taken = np.zeros(spare.shape[0], dtype=np.int64)
    taken[:j] = spare[:j]
    taken[j] = need - (int(run[j - 1]) if j else 0)
    taken = taken[::-1]  # by batch, forwards
    keep = np.ones(samples.shape[0], dtype=bool)
    for b in np.flatnonzero(taken):
        keep[offsets[b + 1] - taken[b] : offsets[b + 1]] = False  # a batch's last samples
    samples[slots] = samples[~keep]
    offsets = np.zeros(flat.shape[0] + 1, dtype=np.int64)
    np.cumsum(flat - taken, out=offsets[1:])
    return dataclasses.replace(plan, samples=samples[keep], offsets=offsets, num_padded=0)


def rotate(plan: Plan, lengths: np.ndarray, constraint: BatchConstraint, rotation: tuple[int, int]) -> Plan:
    """Step 3 of the module docstring. The samples, in the seed's cyclic order from ``epoch * r`` on, are
    walked until the r left out are chosen: a left-out sample met stays out; a planned one takes the left-out
    sample still waiting that the cycle meets last if its batch fits with it, else the longest waiting one
    it fits with, and goes out in its place. Where every batch takes any sample (lone batches) the r left
    out are the next r of the cycle, epoch after epoch.
    plan: made with ``drop_last`` (no padding), r = ``num_dropped`` > 0. About O(r log r) batch checks."""
    key, epoch = rotation
    n = lengths.shape[0]
    left = plan.leftover.astype(np.int64)
    r = left.shape[0]
    rank = np.empty(n, dtype=np.int64)
    rank[np.random.Generator(np.random.PCG64(key)).permutation(n)] = np.arange(n, dtype=np.int64)
    samples = plan.samples.copy()
    where = np.full(n, -1, dtype=np.int64)  # each planned sample's position in ``samples`` (-1: left out)
    where[samples] = np.arange(samples.shape[0], dtype=np.int64)
    # the cycle from the epoch's offset (its first few: the walk ends once r are chosen, unless batches that
    # fit no waiting sample, full of the budget already, hold it up)
    key_of = (rank - epoch * r) % n  # each sample's place in this epoch's cycle
    cycle = np.argsort(key_of, kind="stable")[: SCAN_PER_SAMPLE * r + SCAN_MIN]
    batch_of = np.repeat(np.arange(plan.offsets.shape[0] - 1, dtype=np.int64), np.diff(plan.offsets))
    # the waiting samples two ways: by length (ascending: a batch fits a prefix of them) and by the cycle's
    # order, met last first; taken ones are skipped (by_len through a union-find to the previous untaken)
    by_len = left[np.lexsort((left, lengths[left]))].tolist()
    by_key = left[np.argsort(-key_of[left], kind="stable")].tolist()
    slot = {d: k for k, d in enumerate(by_len)}
    taken = [False] * r
    below = list(range(-1, r - 1))  # below[k]: the slot to look at next when slot k is taken

    def untaken_at_or_below(k: int) -> int:
        path = []
        while k >= 0 and taken[k]:
            path.append(k)
            k = below[k]
        for q in path:  # every slot between k and q is taken (for good): q points at k now
            below[q] = k
        return k

    def take(d: int) -> None:
        taken[slot[d]] = True

    top = 0  # by_key's first untaken
    out: list[int] = []
    left_count = r
    for x in cycle.tolist():
        if not left_count:
            break
        p = int(where[x])
        if p < 0:  # left out by the plan, met in the cycle: it stays out
            if not taken[slot[x]]:
                take(x)
                out.append(x)
                left_count -= 1
            continue
        while taken[slot[by_key[top]]]:
            top += 1
        b = int(batch_of[p])
        lo_b, hi_b = int(plan.offsets[b]), int(plan.offsets[b + 1])
        trial = samples[lo_b:hi_b].astype(np.int64)
        i = p - lo_b
        trial[i] = d = by_key[top]
        if not constraint.fits(lengths[trial]):
            lo, hi = 0, r  # by_len[:lo] fit, by_len[hi:] do not (taken or not: the check is on lengths)
            while lo < hi:
                mid = (lo + hi) // 2
                trial[i] = by_len[mid]
                if constraint.fits(lengths[trial]):
                    lo = mid + 1
                else:
                    hi = mid
            k = untaken_at_or_below(lo - 1)
            if k < 0:
                continue  # this batch fits no waiting sample
            d = by_len[k]
        take(d)
        out.append(x)
        samples[p] = d
        left_count -= 1
    leftover = np.array(out + [d for d in by_len if not taken[slot[d]]], dtype=plan.samples.dtype)
    return dataclasses.replace(plan, samples=samples, num_dropped=int(leftover.shape[0]), leftover=leftover)
