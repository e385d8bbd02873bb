"""One epoch of the map-style sampler as planned steps (plan layer, numpy):
the ordinary plan, a weighted mix of sources (``core.mix``) and elastic
segments (``elastic``) composed.

The epoch's samples are the whole dataset, or the mix's draw for the epoch;
they are planned by the ordinary planner as one set (so mixed steps are
balanced and budgeted like any other), a mix's steps are ordered so that
every stretch of training holds the sources in proportion
(``interleave.py``), and the epoch is cut into segments if the world size
changed mid-epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.mix import Mix
from ..core.plan import Plan
from .elastic import PlanFn, Segments, plan_segments, remap


@dataclass(frozen=True)
class EpochPlan:
    """plan: the current world's steps (sample indices into the dataset);
    base: steps of the epoch run before them by earlier world sizes (0
    unless resumed elastically). The epoch has ``base + plan.num_steps``
    steps; this world runs steps ``base ..`` of it."""

    plan: Plan
    base: int = 0

    @property
    def num_steps(self) -> int:
        return self.base + self.plan.num_steps

    def batch(self, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s batch of epoch step ``step`` (>= base)."""
        return self.plan.batch(step - self.base, rank)


def plan_epoch_steps(lengths: np.ndarray, plan_fn: PlanFn, world_size: int, seed: int, epoch: int, *,
                     mix: Mix | None = None, shuffle: bool = True, segments: Segments = (),
                     keep: np.ndarray | None = None) -> EpochPlan:
    """Plan epoch ``epoch``.

    lengths: (N,) int64, all sources concatenated when mixing.
    plan_fn(lengths, world_size, seed, epoch) -> Plan: the ordinary planner
    with every other setting bound. keep: sorted (K,) int64 indices of the
    samples that may be planned (None: all; e.g. those within max_length):
    the others are left out, also when a mix draws them. Without mix,
    segments and keep this is exactly ``plan_fn(lengths, world_size, seed,
    epoch)``.
    """
    if mix is None:
        if keep is None:
            plan, base = plan_segments(lengths, plan_fn, world_size, segments, seed, epoch)
            return EpochPlan(plan, base)
        plan, base = plan_segments(lengths[keep], plan_fn, world_size, segments, seed, epoch)
        return EpochPlan(remap(plan, keep), base)
    drawn = mix.draw(seed, epoch, shuffle)
    if keep is not None:
        allowed = np.zeros(lengths.shape[0], dtype=bool)
        allowed[keep] = True
        drawn = drawn[allowed[drawn]]
    from .interleave import source_labels  # lazy for start-up: no numba before the first plan

    labels = source_labels(mix.source_of(drawn), mix.num_sources)
    plan, base = plan_segments(lengths[drawn], plan_fn, world_size, segments, seed, epoch,
                               labels=labels, num_sources=mix.num_sources)
    return EpochPlan(remap(plan, drawn), base)
