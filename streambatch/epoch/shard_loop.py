"""An epoch of shard-affine windows (``read_mode="shard"``), with elastic
segments: the loop behind ``READ_MODES["shard"]`` (registered here), for one
shard list and for mixed sources.

Without segments each window (>= W shards of the epoch's shard order; or,
for a mix, the window's share of every source's quota) is planned by the
shard-affine planner (``planners/shard_affine``: ``plan_affine_window``), its
leftover carried, with its holder, into the next window. A mix's window cuts
each source's part into W pieces on its own (``group_cuts``), and its steps
are interleaved by source as in sample mode.

Elastic resume (segments: the finished ``(world_size, steps)`` runs of the
epoch; the current world is ``config.world_size``). The epoch is replayed
at the old world size up to the step where its segment ended, then:

- **Inside a window**, the window's plan is cut after the trained steps and
  its untrained samples (and what it would have carried) are finished in
  *sample mode* at the new world size: planned across all ranks by the
  planner the shard-affine planner pools with (``CROSS_RANK_PLANNER``,
  under the same batch rule and options), each rank fetching
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

Steps: the epoch is held to the shard-affine planner's bound, 1.10 x the
fewest + 1 (its ``Planner.step_slack``, with the reason), spent window by
window (``step_budget.py``): each window, and a replanned rest, is planned
within its share; a window whose walk cannot meet it is planned across
ranks (``plan_affine_window``), each sample a rank trains without having
streamed it a ranged read.

Stream: ``Window`` objects in epoch order, each rank reading a contiguous piece of the window's shards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from ..core.plan import Plan
from ..core.registry import get_planner
from ..planners import RECOMMENDED
from ..planners.shard_affine.planner import CROSS_RANK_PLANNER, foreign_samples, plan_affine_window, warm_up
from ..planners.shard_affine.planner import PLANNER as SHARD_AFFINE
from .elastic import Segments, remaining, truncate
from .read_modes import ReadMode, register_read_mode
from .sample_loop import WindowInput, piece_seed
from .step_budget import StepBudget
from .windows import Window, WindowConfig, shard_order, window_bounds, window_seed

UNHELD = -1  # holder of a carried sample whose bytes no rank of this world holds


def affine_windows(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                   epoch: int, segments: Segments = (), window_of: Callable[[int], int] | None = None
                   ) -> Iterator[Window]:
    """Plan a shard-mode epoch over one shard list window by window (see the
    module docstring).

    counts: (S,) int64 samples per shard; load_lengths(shard) -> (n,) int64.
    segments: the epoch's finished (world_size, steps) runs. window_of(W):
    the window_samples a world of W ranks used (default: the config's, for
    every W). A window cut by a segment end is yielded as pieces sharing its
    index: the trained steps (truncated plan) and the replanned rest.
    """
    window_of = window_of or (lambda _w: config.window_samples)
    next_input = _shard_list_inputs(counts, load_lengths, config, epoch, window_of)
    # the lookahead (step_budget.py): every sample of the epoch, from the catalog's lengths in memory
    every = np.concatenate([np.zeros(0, dtype=np.int64)] +
                           [np.asarray(load_lengths(s), dtype=np.int64) for s in range(counts.shape[0])])
    yield from plan_affine(next_input, config, epoch, segments, expected=every,
                           windows_left=next_input.windows_left)  # type: ignore[attr-defined]


def _shard_list_inputs(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                       epoch: int, window_of: Callable[[int], int]) -> Callable[[int], WindowInput | None]:
    """next_input(world) -> the epoch's next window (>= W shards of the
    shuffled shard order, ``window_of(W)`` samples), or None at the end. The
    shards left are cut anew when the world changes (window_bounds is
    greedy from the left, so the cuts are those of the whole order)."""
    order = shard_order(counts.shape[0], config.seed, epoch, config.shuffle)
    ordered = counts[order]
    none = np.zeros(0, dtype=np.int64)
    at = {"pos": 0, "j": 0, "world": -1, "bounds": none}

    def next_input(w: int) -> WindowInput | None:
        pos = at["pos"]
        if pos >= order.shape[0]:
            return None
        if w != at["world"]:
            at["bounds"], at["world"] = window_bounds(ordered[pos:], window_of(w), min_shards=w) + pos, w
        bounds = at["bounds"]
        nxt = int(bounds[int(np.searchsorted(bounds, pos, side="right"))])
        shards = order[pos:nxt]
        lens = [np.asarray(load_lengths(int(s)), dtype=np.int64) for s in shards]
        sizes = np.array([x.shape[0] for x in lens], dtype=np.int64)
        local = np.concatenate([none] + [np.arange(x.shape[0], dtype=np.int64) for x in lens])
        win = WindowInput(at["j"], np.repeat(shards, sizes), local, np.concatenate([none] + lens),
                          nxt == order.shape[0])
        at["pos"], at["j"] = nxt, at["j"] + 1
        return win

    def windows_left() -> int:
        """Windows still to come after the last one given (cut for the last world asked)."""
        bounds = at["bounds"]
        return int(bounds.shape[0] - 1 - np.searchsorted(bounds, at["pos"], side="left"))

    next_input.windows_left = windows_left  # type: ignore[attr-defined]
    return next_input


def plan_affine(next_input: Callable[[int], WindowInput | None], config: WindowConfig, epoch: int,
                segments: Segments = (), source_of: Callable[[np.ndarray], np.ndarray] | None = None,
                num_sources: int = 1, expected: np.ndarray | None = None,
                windows_left: Callable[[], int] | None = None) -> Iterator[Window]:
    """The shard-mode window loop: ``next_input(world)`` gives each window's
    new samples in streaming order (a shard list's shards, or a mix's
    quotas), planned shard-affine at the world of the segment it falls in.
    With ``source_of`` (shard ids -> source of each sample) a mixed window's
    steps are interleaved by source (``planners/interleave.py``). The lookahead
    (``step_budget.py``): ``expected`` (N,) int64 the lengths of every sample
    the epoch's windows will give, ``windows_left()`` how many windows are
    still to come after the last one given."""
    none = np.zeros(0, dtype=np.int64)
    carry_ids = carry_local = carry_len = carry_holder = none
    step = 0
    seg = 0
    seg_end = segments[0][1] if segments else None  # epoch step where the current segment ends
    # the epoch's step limit, spent window by window: the shard-affine planner's bound, 1.10 x fewest + 1
    # (its Planner record says why: planners/shard_affine/planner.py STEP_SLACK)
    budget = StepBudget(config.limits)
    if expected is not None:
        budget.expect(config.limits.kept(expected), config.drop_last)

    def world() -> int:
        return segments[seg][0] if seg < len(segments) else config.world_size

    def mixed(plan: Plan, ids: np.ndarray) -> Plan:
        from .interleave import interleave_steps  # lazy for start-up: no numba before the first plan

        return plan if source_of is None else interleave_steps(plan, source_of(ids), num_sources)

    while True:
        while seg_end is not None and step == seg_end:  # a segment ended on this window boundary
            seg += 1
            seg_end = step + segments[seg][1] if seg < len(segments) else None
            carry_holder = np.full(carry_holder.shape[0], UNHELD, dtype=np.int64)
            budget.reset()
        new = next_input(world())
        if new is None:
            break
        j, last = new.index, new.last
        left_windows = windows_left() if windows_left is not None else 0
        new_len = np.asarray(new.lengths, dtype=np.int64)
        budget.show(config.limits.kept(new_len))
        win, lengths, held = _affine_window(new, config, world(), epoch, step,
                                            (carry_ids, carry_local, carry_len, carry_holder), source_of, budget,
                                            left_windows)
        win = replace(win, plan=mixed(win.plan, win.shard_ids))
        if seg_end is not None and step + win.num_steps > seg_end:
            # the segment ends inside this window: its first steps were trained, the rest is finished in sample mode
            cut = seg_end - step
            if cut > 0:
                yield replace(win, plan=truncate(win.plan, cut), last=False, lengths=lengths)
            rest = remaining(np.arange(win.shard_ids.shape[0], dtype=np.int64), win.plan, cut)
            ids, local, lengths = win.shard_ids[rest], win.local[rest], lengths[rest]
            step += cut
            piece = 1
            while True:
                seg += 1
                seg_end = step + segments[seg][1] if seg < len(segments) else None
                budget.reset()
                drop = config.drop_last if last else True
                plan = mixed(_across_ranks(lengths, config, world(), drop, piece_seed(config.seed, epoch, j, piece),
                                           budget.cap(lengths, world(), drop, windows_left=left_windows),
                                           carry=not last), ids)
                if seg_end is None or step + plan.num_steps <= seg_end:
                    break
                cut = seg_end - step  # another resize inside the replanned rest
                if cut > 0:
                    yield Window(j, step, truncate(plan, cut), ids, local, False, reads=_fetch_rows(plan, ids, local),
                                 lengths=lengths)
                rest = remaining(np.arange(ids.shape[0], dtype=np.int64), plan, cut)
                ids, local, lengths = ids[rest], local[rest], lengths[rest]
                step += cut
                piece += 1
            win = Window(j, step, plan, ids, local, last, reads=_fetch_rows(plan, ids, local), lengths=lengths)
            left = plan.leftover if plan.leftover is not None else none
            budget.spend(np.delete(lengths, left), plan.num_steps)
            carry_ids, carry_local, carry_len = ids[left], local[left], lengths[left]
            carry_holder = np.full(left.shape[0], UNHELD, dtype=np.int64)
        else:
            left = win.plan.leftover  # carried on by its holder; an unheld sample stays unheld
            budget.spend(np.delete(lengths, left), win.num_steps)
            if not last:
                carry_ids, carry_local, carry_len, carry_holder = (x[left] for x in
                                                                   (win.shard_ids, win.local, lengths, held))
        yield win
        step += win.num_steps
    if seg_end is not None and step < seg_end:
        raise ValueError(f"elastic segment {seg} ends at step {seg_end} but the epoch has only {step} steps; "
                         "the state does not belong to these shards and settings")


def _affine_window(new: WindowInput, config: WindowConfig, w: int, epoch: int, step: int,
                   carry: tuple[np.ndarray, ...], source_of: Callable[[np.ndarray], np.ndarray] | None = None,
                   budget: StepBudget | None = None, windows_left: int = 0
                   ) -> tuple[Window, np.ndarray, np.ndarray]:
    """Window ``new`` planned shard-affine at world ``w`` within its share of
    the epoch's step limit (``budget``'s cap; none without), its samples'
    (n,) int64 lengths and (n,) int64 holders (UNHELD for carried samples no
    rank holds). carry: (ids, local,
    lengths, holder) (c,) int64 each, holder UNHELD for samples no rank
    holds (dealt round-robin for planning, fetched by whoever trains them;
    carried on unheld when not trained).
    source_of: a mix's shard ids -> source; each source's samples (contiguous
    in ``new``) are then cut into W pieces on their own. windows_left: the
    windows still to come (the budget's lookahead)."""
    carry_ids, carry_local, carry_len, carry_holder = carry
    new_len = np.asarray(new.lengths, dtype=np.int64)
    kept = np.arange(new_len.shape[0], dtype=np.int64)
    over = 0
    if config.limits.leaves_out:
        kept = np.flatnonzero(~config.limits.too_long(new_len))  # the long-sample policy
        over = int(new_len.shape[0] - kept.shape[0])
    unheld = carry_holder == UNHELD
    holder_in = np.where(unheld, np.cumsum(unheld) - 1, carry_holder) % max(w, 1)
    groups = None
    if source_of is not None:
        src = source_of(new.ids[kept])
        groups = np.flatnonzero(np.diff(src, prepend=-1, append=-1)).astype(np.int64)
    cap = None
    if budget is not None:  # the window's share of the epoch's step limit (over it: see plan_affine_window)
        cap = budget.cap(np.concatenate([carry_len, new_len[kept]]), w, config.drop_last if new.last else True,
                         windows_left=windows_left)
    aw = plan_affine_window(carry_len, holder_in, new_len[kept], config.limits, w, config.shuffle, new.last,
                            config.drop_last, window_seed(config.seed, epoch, new.index),
                            config.resolved_options["bucket_width"], groups, cap)
    c = carry_ids.shape[0]
    ids = np.concatenate([carry_ids, new.ids[kept]])
    local = np.concatenate([carry_local, new.local[kept]])
    # A left-out (too long) sample is streamed, unused, by the rank whose piece it falls in.
    n = new_len.shape[0]
    if groups is None:  # cuts between kept samples, moved to the window's whole sample sequence
        cuts = np.concatenate([[0], np.append(kept, n)[aw.cuts[1:-1]], [n]])
        rank = np.repeat(np.arange(w, dtype=np.int64), np.diff(cuts))
    elif kept.shape[0]:  # the rank of the kept sample before it (of the first kept sample, before any)
        rank = aw.holder[c:][np.maximum(np.searchsorted(kept, np.arange(n), side="right") - 1, 0)]
    else:
        rank = np.zeros(n, dtype=np.int64)
    reads = run_reads(new.ids, new.local, rank)
    held = aw.holder.copy()
    held[: unheld.shape[0]][unheld] = UNHELD  # whoever trains an unheld sample fetches it
    extra = foreign_samples(aw.plan, held)
    if extra.shape[0]:
        i = extra[:, 1]
        more = np.stack([extra[:, 0], ids[i], local[i], local[i] + 1], axis=1)
        reads = np.concatenate([reads, more])
        reads = reads[np.argsort(reads[:, 0], kind="stable")]
    lengths = np.concatenate([carry_len, new_len[kept]])
    win = Window(new.index, step, aw.plan, ids, local, new.last, aw.holder, reads, c, over, lengths)
    return win, lengths, held


def _across_ranks(lengths: np.ndarray, config: WindowConfig, w: int, drop_last: bool, seed: int,
                  step_cap: int | None, carry: bool = False) -> Plan:
    """The untrained rest of a window cut by a resize, planned across all ranks of the new world (as sample
    mode plans a window) by ``CROSS_RANK_PLANNER``, under the configuration's batch rule and options, within
    ``step_cap`` (its share of the epoch's step limit at the new world); ``carry``: its leftover goes on to the
    next window."""
    planner = get_planner(CROSS_RANK_PLANNER)
    return planner.run(lengths, config.limits.bind(lengths, w, step_cap, carry), w, config.shuffle, drop_last, seed, 0,
                       config.resolved_options)


def _fetch_rows(plan: Plan, ids: np.ndarray, local: np.ndarray) -> np.ndarray:
    """(k, 4) int64 rows (rank, shard, lo, lo + 1) of a sample-mode piece:
    every (rank, sample) it trains, one ranged read each, sorted by rank."""
    rows = foreign_samples(plan, np.full(ids.shape[0], UNHELD, dtype=np.int64))
    i = rows[:, 1]
    return np.stack([rows[:, 0], ids[i], local[i], local[i] + 1], axis=1).reshape(-1, 4)


def run_reads(ids: np.ndarray, local: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """(k, 4) int64 rows (rank, shard, lo, hi): a window's new samples (ids,
    local, rank: (n,) int64, in streaming order; rank: who streams each)
    as runs of consecutive samples of one shard for one rank (one ranged
    read each), in order."""
    n = ids.shape[0]
    if n == 0:
        return np.zeros((0, 4), dtype=np.int64)
    brk = np.ones(n, dtype=bool)
    brk[1:] = (rank[1:] != rank[:-1]) | (ids[1:] != ids[:-1]) | (local[1:] != local[:-1] + 1)
    starts = np.flatnonzero(brk)
    ends = np.append(starts[1:], n)
    rows = np.stack([rank[starts], ids[starts], local[starts], local[ends - 1] + 1], axis=1).astype(np.int64)
    return rows[np.argsort(rows[:, 0], kind="stable")]


def _mixed(inputs: Iterator[WindowInput], config: WindowConfig, epoch: int, segments: Segments,
           source_of: Callable[[np.ndarray], np.ndarray], num_sources: int) -> Iterator[Window]:
    todo = list(inputs)  # the lookahead (step_budget.py): the mix's windows, drawn before the first is planned
    taken = [0]

    def next_input(_w: int) -> WindowInput | None:
        if taken[0] == len(todo):
            return None
        taken[0] += 1
        win, todo[taken[0] - 1] = todo[taken[0] - 1], None  # type: ignore[call-overload]  # planned: let go
        return win

    every = np.concatenate([np.zeros(0, dtype=np.int64)] + [np.asarray(w.lengths, dtype=np.int64) for w in todo])
    yield from plan_affine(next_input, config, epoch, segments, source_of, num_sources, every,
                           lambda: len(todo) - taken[0])


def _warm_up(config: WindowConfig, world_size: int) -> None:
    warm_up(config.limits, world_size, config.resolved_options["bucket_width"])


# Window sizes when the user gives none: at least 2,500 per rank (each rank's own samples must be many enough
# to cut balanced batches from: see bench/affinity.py). Module-level, not a lambda: datasets travel by pickle.
def _default_window(world_size: int) -> int:
    return max(20_000, 2_500 * world_size)


# planner= in shard mode: the default (the recommended planner's name, as StreamingBatches' default) and the
# shard-affine planner's own name plan with the walk; any other is refused (issue 30: never silently replaced).
SHARD = register_read_mode(ReadMode("shard", affine_windows, _mixed, _default_window, _warm_up, rank_share=True,
                                    planner=SHARD_AFFINE.name, fingerprint_tag=("shard",),
                                    accepts=(RECOMMENDED, SHARD_AFFINE.name)))
