"""An epoch of shard-affine windows (``read_mode="shard"``), with elastic
segments: the loop behind ``window.iter_windows`` in shard mode.

Without segments each window (>= W shards of the epoch's shard order) is
planned by ``affinity.plan_affine_window``, its leftover carried, with its
holder, into the next window.

Elastic resume (segments: the finished ``(world_size, steps)`` runs of the
epoch; the current world is ``config.world_size``). The epoch is replayed
at the old world size up to the step where its segment ended, then:

- **Inside a window**, the window's plan is cut after the trained steps and
  its untrained samples (and what it would have carried) are finished in
  *sample mode* at the new world size: planned across all ranks with the
  bucketed planner (the options shard mode validated), each rank fetching
  its samples by ranged reads, a one-off extra cost of at most one window's
  bytes. Seeds come from (seed, epoch, window, piece) like sample mode's.
- **On a window boundary**, nothing is replanned.

Either way the samples carried into the next window have no holder in the
new world (their bytes were in the old ranks' memory): they are dealt to
ranks round-robin for water-filling and each costs its trainer one ranged
read (a one-sample row of ``Window.reads``). Every later window is
shard-affine at the new world size, the shards left in the epoch's order
cut into windows for that world (``window_samples`` and min W shards for
it); so every sample of the epoch is trained once, except the final step's
padding or drop. Without segments the output is ``iter_windows``' as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from ..core.plan import Plan
from ..planners import plan_epoch
from ..planners.elastic import Segments, remaining, truncate
from .affinity import foreign_samples, plan_affine_window
from .window import Window, WindowConfig, shard_order, window_bounds, window_seed

UNHELD = -1  # holder of a carried sample whose bytes no rank of this world holds


def affine_windows(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                   epoch: int, segments: Segments = (), window_of: Callable[[int], int] | None = None
                   ) -> Iterator[Window]:
    """Plan a shard-mode epoch window by window (see the module docstring).

    counts: (S,) int64 samples per shard; load_lengths(shard) -> (n,) int64.
    segments: the epoch's finished (world_size, steps) runs. window_of(W):
    the window_samples a world of W ranks used (default: the config's, for
    every W). A window cut by a segment end is yielded as pieces sharing its
    index: the trained steps (truncated plan) and the replanned rest.
    """
    from .replan import piece_seed  # replan imports window; imported here to keep the import graph a tree

    window_of = window_of or (lambda _w: config.window_samples)
    order = shard_order(counts.shape[0], config.seed, epoch, config.shuffle)
    ordered = counts[order]
    none = np.zeros(0, dtype=np.int64)
    carry_ids = carry_local = carry_len = carry_holder = none
    step = pos = j = 0
    seg = 0
    seg_end = segments[0][1] if segments else None  # epoch step where the current segment ends
    bounds, bounds_world = none, -1  # window cuts of the shard order (positions) for world bounds_world

    def world() -> int:
        return segments[seg][0] if seg < len(segments) else config.world_size

    while pos < order.shape[0]:
        while seg_end is not None and step == seg_end:  # a segment ended on this window boundary
            seg += 1
            seg_end = step + segments[seg][1] if seg < len(segments) else None
            carry_holder = np.full(carry_holder.shape[0], UNHELD, dtype=np.int64)
        w = world()
        if w != bounds_world:  # the shards left, cut into windows for this world (greedy: same cuts as at 0)
            bounds, bounds_world = window_bounds(ordered[pos:], window_of(w), min_shards=w) + pos, w
        nxt = int(bounds[int(np.searchsorted(bounds, pos, side="right"))])
        last = nxt == order.shape[0]
        win, lengths, held = _affine_window(order[pos:nxt], load_lengths, config, w, epoch, j, last, step,
                                      (carry_ids, carry_local, carry_len, carry_holder))
        if seg_end is not None and step + win.num_steps > seg_end:
            # the segment ends inside this window: its first steps were trained, the rest is finished in sample mode
            cut = seg_end - step
            if cut > 0:
                yield replace(win, plan=truncate(win.plan, cut), last=False)
            rest = remaining(np.arange(win.shard_ids.shape[0], dtype=np.int64), win.plan, cut)
            ids, local, lengths = win.shard_ids[rest], win.local[rest], lengths[rest]
            step += cut
            piece = 1
            while True:
                seg += 1
                seg_end = step + segments[seg][1] if seg < len(segments) else None
                cfg = replace(config, world_size=world(), drop_last=config.drop_last if last else True,
                              seed=piece_seed(config.seed, epoch, j, piece), planner="bucketed", read_mode="sample")
                plan = plan_epoch(lengths, cfg, 0)
                if seg_end is None or step + plan.num_steps <= seg_end:
                    break
                cut = seg_end - step  # another resize inside the replanned rest
                if cut > 0:
                    yield Window(j, step, truncate(plan, cut), ids, local, False, reads=_fetch_rows(plan, ids, local))
                rest = remaining(np.arange(ids.shape[0], dtype=np.int64), plan, cut)
                ids, local, lengths = ids[rest], local[rest], lengths[rest]
                step += cut
                piece += 1
            win = Window(j, step, plan, ids, local, last, reads=_fetch_rows(plan, ids, local))
            left = plan.leftover if plan.leftover is not None else none
            carry_ids, carry_local, carry_len = ids[left], local[left], lengths[left]
            carry_holder = np.full(left.shape[0], UNHELD, dtype=np.int64)
        elif not last:
            left = win.plan.leftover  # carried on by its holder; an unheld sample stays unheld
            carry_ids, carry_local, carry_len, carry_holder = (x[left] for x in
                                                               (win.shard_ids, win.local, lengths, held))
        yield win
        step += win.num_steps
        pos, j = nxt, j + 1
    if seg_end is not None and step < seg_end:
        raise ValueError(f"elastic segment {seg} ends at step {seg_end} but the epoch has only {step} steps; "
                         "the state does not belong to these shards and settings")


def _affine_window(shards: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig, w: int,
                   epoch: int, j: int, last: bool, step: int, carry: tuple[np.ndarray, ...]
                   ) -> tuple[Window, np.ndarray, np.ndarray]:
    """Window ``j`` (``shards``: its shard ids in order) planned shard-affine
    at world ``w``, its samples' (n,) int64 lengths and (n,) int64 holders
    (UNHELD for carried samples no rank holds). carry: (ids, local,
    lengths, holder) (c,) int64 each, holder UNHELD for samples no rank
    holds (dealt round-robin for planning, fetched by whoever trains them;
    carried on unheld when not trained)."""
    carry_ids, carry_local, carry_len, carry_holder = carry
    none = np.zeros(0, dtype=np.int64)
    lens = [np.asarray(load_lengths(int(s)), dtype=np.int64) for s in shards]
    sizes = np.array([x.shape[0] for x in lens], dtype=np.int64)
    new_len = np.concatenate([none] + lens)
    new_ids = np.repeat(shards, sizes)
    new_local = np.concatenate([none] + [np.arange(x.shape[0], dtype=np.int64) for x in lens])
    kept = np.arange(new_len.shape[0], dtype=np.int64)
    over = 0
    if config.max_length is not None:
        kept = np.flatnonzero(new_len <= config.max_length)
        over = int(new_len.shape[0] - kept.shape[0])
    unheld = carry_holder == UNHELD
    holder_in = np.where(unheld, np.cumsum(unheld) - 1, carry_holder) % max(w, 1)
    aw = plan_affine_window(carry_len, holder_in, new_len[kept], config.max_batch_tokens, config.max_batch_size,
                            w, config.shuffle, last, config.drop_last, window_seed(config.seed, epoch, j),
                            dict(config.planner_options))
    ids = np.concatenate([carry_ids, new_ids[kept]])
    local = np.concatenate([carry_local, new_local[kept]])
    # Cuts between kept samples, moved to the window's whole sample sequence: a left-out
    # (too long) sample is streamed, unused, by the rank whose piece it falls in.
    cuts = np.concatenate([[0], np.append(kept, new_len.shape[0])[aw.cuts[1:-1]], [new_len.shape[0]]])
    reads = piece_reads(shards, sizes, cuts)
    held = aw.holder.copy()
    held[: unheld.shape[0]][unheld] = UNHELD  # whoever trains an unheld sample fetches it
    extra = foreign_samples(aw.plan, held)
    if extra.shape[0]:
        i = extra[:, 1]
        more = np.stack([extra[:, 0], ids[i], local[i], local[i] + 1], axis=1)
        reads = np.concatenate([reads, more])
        reads = reads[np.argsort(reads[:, 0], kind="stable")]
    lengths = np.concatenate([carry_len, new_len[kept]])
    win = Window(j, step, aw.plan, ids, local, last, aw.holder, reads, carry_ids.shape[0], over)
    return win, lengths, held


def _fetch_rows(plan: Plan, ids: np.ndarray, local: np.ndarray) -> np.ndarray:
    """(k, 4) int64 rows (rank, shard, lo, lo + 1) of a sample-mode piece:
    every (rank, sample) it trains, one ranged read each, sorted by rank."""
    rows = foreign_samples(plan, np.full(ids.shape[0], UNHELD, dtype=np.int64))
    i = rows[:, 1]
    return np.stack([rows[:, 0], ids[i], local[i], local[i] + 1], axis=1).reshape(-1, 4)


def piece_reads(shards: np.ndarray, sizes: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """(k, 4) int64 rows (rank, shard, lo, hi): rank r's piece
    ``cuts[r]:cuts[r + 1]`` of the window's sample sequence, split where
    shards end (empty shards and empty pieces give no row)."""
    edges = np.concatenate([[0], np.cumsum(sizes)])
    rows = []
    for r in range(cuts.shape[0] - 1):
        a, b = int(cuts[r]), int(cuts[r + 1])
        if a == b:
            continue
        first = int(np.searchsorted(edges, a, side="right")) - 1
        for j in range(first, shards.shape[0]):
            lo, hi = max(a, int(edges[j])), min(b, int(edges[j + 1]))
            if lo >= b:
                break
            if lo < hi:
                rows.append((r, int(shards[j]), lo - int(edges[j]), hi - int(edges[j])))
    return np.array(rows, dtype=np.int64).reshape(-1, 4)
