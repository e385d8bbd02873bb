"""A slow, obviously correct pure-Python twin of the seed-exact planner.

Written from the specification, not from the Numba kernels: Python's own
``random.Random``, ``sorted`` and plain lists, O(N * W**2). The tests prove the
fast planner right by comparing it with these functions on many random inputs,
and the benchmarks time it as the pure-Python baseline (it is the seed's
algorithm; measured ~1.4x faster than the seed's own code at W=8, so speed-up
ratios against it are conservative). Not for training use.

A plan here is a list of global steps; a step is a list of W per-rank batches;
a batch is a list of sample indices in placement order.
"""

from __future__ import annotations

import random


def chunk_size(world_size: int, max_batch_size: int) -> int:
    """The seed's sortish chunk: W * B * 8 samples, clamped to [64, 512]."""
    return min(max(64, world_size * max(1, max_batch_size) * 8), 512)


def sortish_order(lengths: list[int], size: int, rng: random.Random) -> list[int]:
    """Sort indices stably by length, shuffle each chunk, then shuffle the chunks."""
    by_length = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks = [by_length[i : i + size] for i in range(0, len(by_length), size)]
    for chunk in chunks:
        rng.shuffle(chunk)
    rng.shuffle(chunks)
    return [i for chunk in chunks for i in chunk]


def placement_key(rank: int, length: int, counts: list[int], max_lens: list[int],
                  step_idx: int, world_size: int) -> tuple[int, ...]:
    """The seed's key for putting a sample of ``length`` on ``rank``; smallest wins."""
    new_count = counts[rank] + 1
    new_max = max(max_lens[rank], length)
    costs = [c * m * m for c, m in zip(counts, max_lens)]
    tokens = [c * m for c, m in zip(counts, max_lens)]
    costs[rank] = new_count * new_max * new_max
    tokens[rank] = new_count * new_max
    return (
        max(costs) - min(costs),
        max(costs),
        sum(costs),
        max(tokens) - min(tokens),
        costs[rank],
        tokens[rank],
        new_count,
        (rank - step_idx) % world_size,
        rank,
    )


def is_closed(rank: int, length: int, counts: list[int], max_lens: list[int],
              max_batch_tokens: int, max_batch_size: int) -> bool:
    """A non-empty batch refuses a sample that breaks the size cap or the budget."""
    new_count = counts[rank] + 1
    new_max = max(max_lens[rank], length)
    return counts[rank] > 0 and (new_count > max_batch_size or new_count * new_max > max_batch_tokens)


def greedy_steps(lengths: list[int], order: list[int], world_size: int, max_batch_tokens: int,
                 max_batch_size: int, drop_last: bool) -> tuple[list[list[list[int]]], list[list[int]] | None]:
    """Plan global steps over ``order``.

    Returns (steps, dropped): ``dropped`` is the final step that ``drop_last``
    refused (it has an empty rank), else None.
    """
    steps: list[list[list[int]]] = []
    pos = 0
    while pos < len(order):
        step: list[list[int]] = [[] for _ in range(world_size)]
        counts = [0] * world_size
        max_lens = [0] * world_size
        while pos < len(order):
            sample = order[pos]
            length = lengths[sample]
            keys = [
                placement_key(r, length, counts, max_lens, len(steps), world_size)
                for r in range(world_size)
                if not is_closed(r, length, counts, max_lens, max_batch_tokens, max_batch_size)
            ]
            if not keys:
                break
            rank = min(keys)[-1]
            step[rank].append(sample)
            counts[rank] += 1
            max_lens[rank] = max(max_lens[rank], length)
            pos += 1
        if drop_last and any(not batch for batch in step):
            return steps, step
        steps.append(step)
    return steps, None


def pad_step(step: list[list[int]]) -> list[list[int]]:
    """streambatch's padding rule for the final step.

    The k-th empty rank (in rank order) gets a one-sample batch holding the
    sample at position ``k mod m`` of the step's m samples, listed rank by rank
    in ascending rank order and in placement order within a rank.
    """
    stored = [s for batch in step for s in batch]
    empty = [r for r, batch in enumerate(step) if not batch]
    padded = [list(batch) for batch in step]
    for k, r in enumerate(empty):
        padded[r] = [stored[k % len(stored)]]
    return padded


def plan_steps(lengths, max_batch_tokens: int, max_batch_size: int = 64, world_size: int = 1,
               shuffle: bool = True, drop_last: bool = False, seed: int = 42, epoch: int = 0,
               pad: bool = False) -> tuple[list[list[list[int]]], list[list[int]] | None]:
    """The epoch's global steps in training order, and the dropped step (or None).

    ``pad=False`` is the seed exactly; ``pad=True`` applies ``pad_step`` to the
    final planned step before the steps are shuffled, as streambatch does.
    """
    lengths = [int(x) for x in lengths]
    rng = random.Random(seed + epoch)
    if shuffle:
        order = sortish_order(lengths, chunk_size(world_size, max_batch_size), rng)
    else:
        order = list(range(len(lengths)))
    steps, dropped = greedy_steps(lengths, order, world_size, max_batch_tokens, max_batch_size, drop_last)
    if pad and steps:
        steps[-1] = pad_step(steps[-1])
    if shuffle:
        rng.shuffle(steps)
    return steps, dropped


def seed_rank_batches(lengths, max_batch_tokens: int, world_size: int = 1, **kwargs) -> list[list[list[int]]]:
    """Per-rank batch lists exactly as the seed yields them (empty batches skipped).

    kwargs: the other ``plan_steps`` arguments (max_batch_size, shuffle, ...).
    """
    steps, _ = plan_steps(lengths, max_batch_tokens, world_size=world_size, pad=False, **kwargs)
    return [[step[r] for step in steps if step[r]] for r in range(world_size)]


def padded_rank_batches(lengths, max_batch_tokens: int, world_size: int = 1, **kwargs) -> list[list[list[int]]]:
    """Per-rank batch lists with streambatch's padding rule: equal counts on every rank."""
    steps, _ = plan_steps(lengths, max_batch_tokens, world_size=world_size, pad=True, **kwargs)
    return [[step[r] for step in steps] for r in range(world_size)]
