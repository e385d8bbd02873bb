"""Window planning (sample read mode) with elastic segments (pure numpy):
the loop behind ``READ_MODES["sample"]`` (registered here), and the windowed
side of ``elastic.py``.

An epoch's windows (``WindowInput``: the window's own samples; one shard list
or a mix of sources) are planned one after another at the world size of the
segment they fall in, each with the samples carried from the window before.
When a segment ends inside a window (the run was saved after ``k`` steps at
world size ``W`` and resumed at ``W'``), the window's plan is cut
after the steps already trained; the rest of the window, and what it carried
in, is planned again for ``W'`` (seed drawn from (seed, epoch, window,
piece)), and the epoch continues window by window at ``W'``. So every sample
of the epoch is trained once, except the final step's counted padding or
drop; every rank of each world takes the same number of steps. Without
segments this is the ordinary epoch. Each window is planned within its
share of the epoch's step limit (``step_budget.py``: the limit is on the
epoch's steps, spent window by window).

Stream: ``Window`` objects in epoch order, each planned across all ranks (replanned rests after a resize)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from ..core.validation import coerce_lengths
from ..planners import plan_epoch
from .elastic import Segments, remaining, truncate
from .read_modes import ReadMode, register_read_mode
from .step_budget import StepBudget
from .windows import Window, WindowConfig, outlier_limit, shard_order, window_bounds, window_seed

_U64 = 1 << 64
_PIECE_TAG = 0x7069656365  # "piece"


@dataclass(frozen=True)
class WindowInput:
    """One window's own samples before planning: (n,) int64 shard ids,
    indices within each shard's sidecar, and planning lengths."""

    index: int
    ids: np.ndarray
    local: np.ndarray
    lengths: np.ndarray
    last: bool


def plain_inputs(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                 epoch: int) -> Iterator[WindowInput]:
    """The windows of ``iter_windows`` (shuffled shard order, cut into
    windows of ``window_samples``), unplanned."""
    order = shard_order(counts.shape[0], config.seed, epoch, config.shuffle)
    bounds = window_bounds(counts[order], config.window_samples)
    nwin = bounds.shape[0] - 1
    for j in range(nwin):
        shards = order[bounds[j] : bounds[j + 1]]
        lens = [np.asarray(load_lengths(int(s)), dtype=np.int64) for s in shards]
        none = np.zeros(0, dtype=np.int64)
        ids = np.concatenate([none] + [np.full(x.shape[0], s, dtype=np.int64) for s, x in zip(shards, lens)])
        local = np.concatenate([none] + [np.arange(x.shape[0], dtype=np.int64) for x in lens])
        yield WindowInput(j, ids, local, np.concatenate([none] + lens), j == nwin - 1)


def piece_seed(seed: int, epoch: int, window: int, piece: int) -> int:
    """Planner seed of piece ``piece`` of a window: the window's own seed for
    piece 0 (as ``iter_windows``), a fresh one for each replanned rest."""
    if piece == 0:
        return window_seed(seed, epoch, window)
    words = np.random.SeedSequence([seed % _U64, epoch, window + 1, piece, _PIECE_TAG]).generate_state(2, np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def plan_windows(inputs: Iterator[WindowInput], config: WindowConfig, epoch: int, segments: Segments = (),
                 source_of: Callable[[np.ndarray], np.ndarray] | None = None, num_sources: int = 1
                 ) -> Iterator[Window]:
    """Plan an epoch's windows (sample read mode): the loop behind
    ``iter_windows``, with elastic ``segments`` (the finished (world_size,
    steps) runs; the current world is ``config.world_size``). With
    ``source_of`` (shard ids -> source of each sample) a mixed window's steps
    are interleaved by source (``planners/interleave.py``).

    Yields the planned windows in step order. A window cut by a segment end
    is yielded as two or more pieces: the trained steps (a truncated plan)
    and the replanned rest (pieces share the window's index).

    With shuffling, outliers (``outlier_limit``) are held back from window to
    window and planned together, in the last window or once they make a
    quarter of one: a step holding an outlier lasts as long as that sample
    alone, so outliers spread over every window would each set the time of a
    step of their own window (on Common Voice Pashto at W = 64, 20,000-sample
    windows without holding plan a 1.8x longer epoch than the whole corpus
    at once). Samples the long-sample policy leaves out (``config.limits.too_long``: over ``max_length``,
    or over the budget with ``long_samples="drop"``) are left out and
    counted (``Window.too_long``).
    """
    none = np.zeros(0, dtype=np.int64)
    carry_ids = carry_local = carry_len = none
    held_ids = held_local = held_len = none
    step = 0
    seg = 0
    seg_end = segments[0][1] if segments else None  # epoch step where the current segment ends
    budget = StepBudget(config.limits)  # the epoch's step limit, spent window by window (step_budget.py)
    # The lookahead: every window's new samples before the first is planned (the lengths come from the
    # catalog in memory), so each window's cap reserves steps for the windows after it (step_budget.py).
    # Sidecar lengths are new input: checked here (cheap), the config once at construction.
    todo = [replace(w, lengths=coerce_lengths(w.lengths)) for w in inputs]
    kept_new = [config.limits.kept(w.lengths) for w in todo]
    budget.expect(np.concatenate([none, *kept_new]), config.drop_last)

    def world() -> int:
        return segments[seg][0] if seg < len(segments) else config.world_size

    for at in range(len(todo)):
        win, new_len = todo[at], kept_new[at]
        todo[at] = kept_new[at] = None  # type: ignore[call-overload]  # planned windows need not stay in memory
        budget.show(new_len)
        ids = np.concatenate([carry_ids, win.ids])
        local = np.concatenate([carry_local, win.local])
        lengths = np.concatenate([carry_len, win.lengths])
        over = 0
        if config.limits.leaves_out:
            keep = ~config.limits.too_long(lengths)  # the long-sample policy; carried samples were kept already
            over = int(keep.size - np.count_nonzero(keep))
            if over:
                ids, local, lengths = ids[keep], local[keep], lengths[keep]
        last = win.last
        if not last and config.shuffle:  # without shuffling, windows keep the corpus order
            out = lengths > outlier_limit(lengths, config.max_batch_tokens, config.max_batch_size)
            if out.any():
                held_ids, held_local, held_len = (np.concatenate([h, x[out]]) for h, x in
                                                  ((held_ids, ids), (held_local, local), (held_len, lengths)))
                ids, local, lengths = ids[~out], local[~out], lengths[~out]
        if held_len.size and (last or 4 * held_len.size >= config.window_samples):
            ids, local, lengths = (np.concatenate([x, h]) for x, h in
                                   ((ids, held_ids), (local, held_local), (lengths, held_len)))
            held_ids = held_local = held_len = none
        piece = 0
        while True:
            # a segment that ended on a window boundary: move to the next world
            while seg_end is not None and step == seg_end:
                seg += 1
                seg_end = step + segments[seg][1] if seg < len(segments) else None
                budget.reset()
            # Each window is planned as epoch 0 of its own seed, so windows differ within an epoch too.
            drop = config.drop_last if last else True
            plan = plan_epoch(lengths, config, 0, world_size=world(), drop_last=drop,
                              seed=piece_seed(config.seed, epoch, win.index, piece),
                              step_cap=budget.cap(lengths, world(), drop, held_len, len(todo) - 1 - at),
                              carry=not last)
            if source_of is not None:
                from .interleave import interleave_steps  # lazy for start-up: no numba before the first plan

                plan = interleave_steps(plan, source_of(ids), num_sources)
            if seg_end is None or step + plan.num_steps <= seg_end:
                break
            # the segment ends inside this window: its first steps were trained, the rest is planned again
            cut = seg_end - step
            if cut > 0:
                yield Window(win.index, step, truncate(plan, cut), ids, local, False, too_long=over, lengths=lengths)
                over = 0
            rest = remaining(np.arange(lengths.shape[0], dtype=np.int64), plan, cut)
            budget.reset()  # the rest is planned at the next world size: its own accounting
            ids, local, lengths = ids[rest], local[rest], lengths[rest]
            step += cut
            piece += 1
        left = plan.leftover if plan.leftover is not None else none
        trained = np.ones(lengths.shape[0], dtype=bool)
        trained[left] = False
        budget.spend(lengths[trained], plan.num_steps)
        if not last:
            carry_ids, carry_local, carry_len = ids[left], local[left], lengths[left]
        yield Window(win.index, step, plan, ids, local, last, too_long=over, lengths=lengths)
        step += plan.num_steps
    if seg_end is not None and step < seg_end:
        raise ValueError(f"elastic segment {seg} ends at step {seg_end} but the epoch has only {step} steps; "
                         "the state does not belong to these shards and settings")


def _plain(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig, epoch: int,
           segments: Segments = (), window_of: Callable[[int], int] | None = None) -> Iterator[Window]:
    # An elastic epoch keeps the windows of its first world throughout (as a mix's do: ``epoch_plan.py``), so the
    # steps replayed are the ones trained; a replanned rest keeps that window size too. window_of(W): the window
    # size at W ranks (the default follows W).
    if segments and window_of is not None:
        config = replace(config, window_samples=window_of(segments[0][0]))
    return plan_windows(plain_inputs(counts, load_lengths, config, epoch), config, epoch, segments)


def _mixed(inputs: Iterator[WindowInput], config: WindowConfig, epoch: int, segments: Segments,
           source_of: Callable[[np.ndarray], np.ndarray], num_sources: int) -> Iterator[Window]:
    return plan_windows(inputs, config, epoch, segments, source_of, num_sources)


def _warm_up(config: WindowConfig, world_size: int) -> None:
    plan_epoch(np.ones(world_size, dtype=np.int64), config, 0)


# Window sizes when the user gives none: 20,000 samples, and at least 2,500 per rank (as shard mode's): each rank's
# share of a window stays the same at any W, and a window holds a few steps more than its partial one (at W = 128,
# 20,000-sample windows held 2-3 steps each; the epoch's one slack step cannot absorb one partial batch per length
# class per window, so each window was held to its fewest steps: Common Voice Pashto at 4 x its longest clip planned
# a 1.72 x longer epoch under B*L^2 + c0 than before the step limit, 0.85 x with these windows). Module-level
# functions, not lambdas: a dataset travels to spawned DataLoader workers by pickle.
def _default_window(world_size: int) -> int:
    return max(20_000, 2_500 * world_size)


SAMPLE = register_read_mode(ReadMode("sample", _plain, _mixed, _default_window, _warm_up, rank_share=False))
