"""Elastic resume (plan layer, pure numpy): finish an epoch on another world size.

An epoch that ran its first ``k`` global steps at world size ``W`` and then
resumes at ``W'`` is planned as *segments*: segment 0 is the ordinary plan of
the epoch at ``W`` (so a resume at the same world size is today's exact
resume), cut after ``k`` steps; the samples it had not reached (including
what its ``drop_last`` would have left over) are planned again, with the same
planner, budget and cost model, for ``W'`` with a seed drawn from
(seed, epoch, segment). Repeated resizes add segments. Every sample of the
epoch is trained exactly once across all segments, except the final step's
documented padding (or drop) of the last segment; every rank of a segment's
world takes the same number of steps.

The history is a short tuple of ``(world_size, steps)`` pairs, one per
finished segment: the state stays a few integers however large the corpus,
and since it holds nothing rank-specific every rank's copy is the same.
A segment that ran its plan to the end leaves nothing to replan: the epoch
is over (its drop, if any, stands).

A saved history is checked before any of it is planned (``read_history``):
at most ``MAX_SEGMENTS`` segments, each of >= 1 step (a resize after no step
records nothing) at a world size in [1, ``max_world``], their steps summing
to at most the epoch's samples (every step trains at least one sample, and
each sample once), and, when the state carries one, its ``history`` digest.

Stream: nothing: an epoch's elastic history, checked, and the plan of its current segment.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..core import state as S
from ..core.plan import Plan, config_fingerprint

_U64 = 1 << 64
_SEGMENT_TAG = 0x656C6173  # "elas": keeps these seeds apart from window and mix seeds

# plan_fn(lengths (m,) int64, world_size, seed, epoch) -> Plan over indices 0..m-1
PlanFn = Callable[[np.ndarray, int, int, int], Plan]
Segments = tuple[tuple[int, int], ...]


def check_segments(segments: Any, name: str = "segments", samples: int | None = None,
                   max_world: int | None = None) -> Segments:
    """Segments as a tuple of (world_size, steps) int pairs, or a ValueError
    naming the bad entry (they come from saved states). O(len(segments)),
    before any planning: at most ``MAX_SEGMENTS`` of them; world sizes in
    [1, max_world] (None: unbounded); steps >= 1, each and their sum at most
    ``samples`` (the epoch's samples, an upper bound on its steps; None:
    unbounded)."""
    if segments is None:
        return ()
    if isinstance(segments, (str, bytes)) or not isinstance(segments, Sequence):
        raise ValueError(f"{name} must be a list of [world_size, steps] pairs, got {segments!r:.200}")
    if len(segments) > S.MAX_SEGMENTS:
        raise ValueError(f"{name} holds {len(segments)} segments, outside [0, {S.MAX_SEGMENTS}] (an epoch is "
                         f"resumed on another world size at most {S.MAX_SEGMENTS} times); {S.DAMAGED}")
    out: list[tuple[int, int]] = []
    done = 0
    for i, seg in enumerate(segments):
        ok = (isinstance(seg, Sequence) and not isinstance(seg, (str, bytes)) and len(seg) == 2
              and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in seg))
        if not ok or seg[0] < 1 or seg[1] < 1:
            raise ValueError(f"{name}[{i}] must be a [world_size >= 1, steps >= 1] pair of ints, got {seg!r:.200}; "
                             f"{S.DAMAGED}")
        w, k = int(seg[0]), int(seg[1])
        if max_world is not None and w > max_world:
            raise ValueError(f"{name}[{i}] = [{w}, {k}]: world_size {w} is outside [1, {max_world}] (a world beyond "
                             f"the epoch's samples, this world size and {S.MAX_RANKS} ranks is not one a run "
                             f"saved); {S.DAMAGED}")
        done += k
        if samples is not None and done > samples:
            what = f"elastic segment {i} claims {k} steps" if k > samples else \
                f"elastic segments 0..{i} claim {done} steps"
            raise ValueError(f"{what} ({name}[{i}] = [{w}, {k}]), outside [1, {samples}]: more than the epoch has "
                             f"samples (every step trains at least one); {S.DAMAGED}")
        out.append((w, k))
    return tuple(out)


def history_digest(fingerprint: int | str, epoch: int, segments: Segments) -> int:
    """The 63-bit digest a state stores under ``history``: its elastic history
    bound to its fingerprint and epoch (rank-independent, like the rest)."""
    flat = np.array([x for seg in segments for x in seg], dtype=np.int64)
    return config_fingerprint(flat, fingerprint, epoch, len(segments))


def read_history(state: Mapping[str, Any], epoch: int, samples: int, max_world: int) -> Segments:
    """The checked elastic history of ``state`` (its fingerprint already
    matched), before any planning: ``check_segments`` bounds, then the
    ``history`` digest when the state has one (states saved before the
    digest existed have none: the bounds alone protect them)."""
    name = f"state[{S.SEGMENTS!r}]"
    segments = check_segments(state.get(S.SEGMENTS), name, samples, max_world)
    if S.HISTORY in state:
        digest = S.state_int(state, S.HISTORY, 0, 2**63 - 1)
        if digest != history_digest(state[S.FINGERPRINT], epoch, segments):
            raise ValueError(f"{name} = {[list(seg) for seg in segments]} (epoch {epoch}) does not match "
                             f"state[{S.HISTORY!r}], the digest saved with it: the history or the epoch was edited "
                             "or damaged; resume from the state as it was saved")
    return segments


def resize(segments: Segments, world_size: int, step: int, base: int, new_world_size: int) -> Segments:
    """The history after a resume at ``new_world_size`` of a run standing at
    epoch step ``step`` of its current segment (world ``world_size``, which
    began at epoch step ``base``). Same world: unchanged. A current segment
    that took no step is replaced rather than recorded."""
    if new_world_size == world_size or step == base:
        return segments
    if len(segments) >= S.MAX_SEGMENTS:
        raise ValueError(f"an epoch can be resumed on another world size at most {S.MAX_SEGMENTS} times; this state "
                         f"has {len(segments)} resizes already: resume at world_size={world_size}, or start the next "
                         "epoch")
    return segments + ((world_size, step - base),)


def segment_seed(seed: int, epoch: int, segment: int) -> int:
    """Planner seed of a replanned segment (>= 1): distinct per (seed, epoch, segment)."""
    words = np.random.SeedSequence([seed % _U64, epoch, segment, _SEGMENT_TAG]).generate_state(2, np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def step_samples(plan: Plan, steps: int) -> np.ndarray:
    """(m,) the samples of the first ``steps`` steps of ``plan`` in training
    order (with repeats, if the final step is padded and included)."""
    if steps <= 0:
        return plan.samples[:0]
    w = plan.world_size
    per_step = np.diff(plan.offsets[::w])  # (n_steps,) samples per planned step
    taken = np.zeros(per_step.shape[0], dtype=bool)
    taken[plan.step_order[:steps]] = True
    return plan.samples[np.repeat(taken, per_step)]


def truncate(plan: Plan, steps: int) -> Plan:
    """The first ``steps`` training steps of ``plan`` as a plan of their own
    (no padding, drop or leftover: those belong to the steps cut away)."""
    keep = plan.step_order[:steps]
    empty = plan.samples[:0]
    return dataclasses.replace(plan, step_order=keep, num_padded=0, num_dropped=0, leftover=empty)


def remap(plan: Plan, index: np.ndarray) -> Plan:
    """``plan`` over ``lengths[index]`` re-expressed in indices of ``lengths``."""
    left = plan.leftover if plan.leftover is not None else plan.samples[:0]
    return dataclasses.replace(plan, samples=index[plan.samples], leftover=index[left])


def remaining(pool: np.ndarray, plan: Plan, steps: int) -> np.ndarray:
    """Sorted (r,) int64 samples of ``pool`` (sorted, distinct) that the first
    ``steps`` steps of ``plan`` (a plan over ``pool``) did not train; empty
    when the plan ran to its end."""
    if steps >= plan.num_steps:
        return pool[:0]
    if pool.shape[0] == 0:
        return pool
    trained = np.zeros(int(pool[-1]) + 1, dtype=bool)
    trained[step_samples(plan, steps)] = True
    return pool[~trained[pool]]


def plan_segments(lengths: np.ndarray, plan_fn: PlanFn, world_size: int, segments: Segments, seed: int,
                  epoch: int, labels: np.ndarray | None = None, num_sources: int = 1) -> tuple[Plan, int]:
    """The current segment's plan and the epoch step it starts at.

    lengths: (N,) int64 lengths of the epoch's samples; the returned plan's
    samples index them. ``segments`` are the finished (world_size, steps)
    segments; the current one runs at ``world_size``. labels: (N,) int64
    source of each sample of a mix, whose steps are then interleaved by
    source (``interleave.py``). Raises ValueError if a segment claims more
    steps than its plan has (the history does not belong to these lengths
    and settings).
    """
    def make(pool: np.ndarray | None, world: int, seed: int, epoch: int) -> Plan:
        # pool None: every sample (no copies of the lengths, no remapping)
        plan = plan_fn(lengths if pool is None else lengths[pool], world, seed, epoch)
        if labels is not None:
            from .interleave import interleave_steps  # lazy for start-up: no numba before the first plan

            plan = interleave_steps(plan, labels if pool is None else labels[pool], num_sources)
        return plan if pool is None else remap(plan, pool)

    plan = make(None, segments[0][0] if segments else world_size, seed, epoch)
    pool = np.arange(lengths.shape[0], dtype=np.int64) if segments else None
    base = 0
    for j, (w, k) in enumerate(segments):
        if k > plan.num_steps:
            raise ValueError(f"elastic segment {j} claims {k} steps at world_size={w} but its plan has "
                             f"{plan.num_steps}; the state does not belong to these lengths and settings")
        pool = remaining(pool, plan, k)
        base += k
        plan = make(pool, segments[j + 1][0] if j + 1 < len(segments) else world_size,
                    segment_seed(seed, epoch, j + 1), 0)
    return plan, base
