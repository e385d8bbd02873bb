"""An epoch of lengths held in memory (plan layer, numpy): the map-style sampler's source, one window per epoch.

The epoch's samples are the whole dataset, or the mix's draw for the epoch; they are planned by the ordinary
planner as one set (so mixed steps are balanced and budgeted like any other), a mix's steps are ordered so
that every stretch of training holds the sources in proportion (``interleave.py``), and the epoch is cut into
segments if the world size changed mid-epoch (``elastic.py``). ``EpochPlan`` holds an ``InMemory`` as it
holds a streaming dataset's shards: its one ``Window`` per epoch starts at the epoch step where this world
began (0 unless resumed elastically), and its plan's sample indices are the dataset's.

Stream: one ``Window`` per epoch (this world's steps of the epoch, in dataset indices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from ..core.config import PlanConfig
from ..core.long_samples import DEFAULT_POLICY
from ..core.mix import Mix
from ..core.plan import Plan, config_fingerprint
from ..planners import plan_epoch
from .elastic import PlanFn, Segments, plan_segments, remap
from .windows import Window


@dataclasses.dataclass(frozen=True, eq=False)
class InMemory:
    """Lengths in memory as an epoch's source.

    lengths: (N,) int64, all sources concatenated when mixing. mix: the
    ``Mix`` of those sources, or None. keep: sorted (K,) int64 indices of the
    samples that may be planned (the long-sample policy's survivors; None:
    all); the others are left out, also when a mix draws them. max_length,
    long_samples: that policy as set (part of the fingerprint when set).
    """

    lengths: np.ndarray
    mix: Mix | None = None
    keep: np.ndarray | None = None
    max_length: int | None = None
    long_samples: str = DEFAULT_POLICY

    @property
    def samples_per_epoch(self) -> int:
        """Samples an epoch plans: the mix's quotas, or every sample once."""
        return self.mix.samples_per_epoch if self.mix is not None else int(self.lengths.shape[0])

    def positions(self, epoch: int) -> list[tuple[int, int]]:
        """Per source, (cycle, position in it) at the start of ``epoch``."""
        return self.mix.positions(epoch) if self.mix is not None else [(epoch, 0)]

    def config_at(self, config: PlanConfig, world_size: int) -> PlanConfig:
        return dataclasses.replace(config, world_size=world_size)

    def fingerprint(self, config: PlanConfig) -> int:
        """The sampler's state fingerprint: the lengths and settings (the long-sample limit and the mix when set,
        so that states saved before either existed still load)."""
        fp = config.fingerprint(self.lengths)
        if self.max_length is not None:
            from ..core.hashing import hash_array  # lazy for start-up: no numba before the first plan

            mark = np.array([self.max_length, self.long_samples == "raise"], dtype=np.int64)
            fp = int(hash_array(mark, np.uint64(fp))) >> 1
        if self.mix is not None:
            fp = config_fingerprint(np.array(self.mix.sizes + self.mix.counts, dtype=np.int64), fp)
        return fp

    def windows(self, config: PlanConfig, epoch: int, segments: Segments = ()) -> Iterator[Window]:
        """The epoch's one window: this world's steps, from the epoch step it began at."""
        plan, base = self.plan(config, epoch, segments)
        yield Window(0, base, plan, None, None, True)

    def plan(self, config: PlanConfig, epoch: int, segments: Segments = ()) -> tuple[Plan, int]:
        """(plan, base): epoch ``epoch`` at ``config.world_size`` after ``segments``, in dataset indices, and the
        epoch step it starts at. Without a mix or a history this is the ordinary plan of the kept samples."""
        kept = self.keep
        if self.mix is None and not segments:
            plan = plan_epoch(self.lengths if kept is None else self.lengths[kept], config, epoch)
            if kept is not None:  # back to dataset indices
                leftover = None if plan.leftover is None else kept[plan.leftover]
                plan = dataclasses.replace(plan, samples=kept[plan.samples], leftover=leftover)
            return plan, 0

        def plan_fn(lengths: np.ndarray, world_size: int, seed: int, epoch: int) -> Plan:
            return plan_epoch(lengths, config, epoch, world_size=world_size, seed=seed)

        return plan_epoch_steps(self.lengths, plan_fn, config.world_size, config.seed, epoch, mix=self.mix,
                                shuffle=config.shuffle, segments=segments, keep=kept)


def plan_epoch_steps(lengths: np.ndarray, plan_fn: PlanFn, world_size: int, seed: int, epoch: int, *,
                     mix: Mix | None = None, shuffle: bool = True, segments: Segments = (),
                     keep: np.ndarray | None = None) -> tuple[Plan, int]:
    """Plan epoch ``epoch``: (the current world's plan, the epoch step it starts at).

    lengths: (N,) int64, all sources concatenated when mixing.
    plan_fn(lengths, world_size, seed, epoch) -> Plan: the ordinary planner
    with every other setting bound. keep: sorted (K,) int64 indices of the
    samples that may be planned (None: all; e.g. those within max_length):
    the others are left out, also when a mix draws them. Without mix,
    segments and keep this is exactly ``(plan_fn(lengths, world_size, seed,
    epoch), 0)``.
    """
    if mix is None:
        if keep is None:
            return plan_segments(lengths, plan_fn, world_size, segments, seed, epoch)
        plan, base = plan_segments(lengths[keep], plan_fn, world_size, segments, seed, epoch)
        return remap(plan, keep), base
    drawn = mix.draw(seed, epoch, shuffle)
    if keep is not None:
        allowed = np.zeros(lengths.shape[0], dtype=bool)
        allowed[keep] = True
        drawn = drawn[allowed[drawn]]
    from .interleave import source_labels  # lazy for start-up: no numba before the first plan

    labels = source_labels(mix.source_of(drawn), mix.num_sources)
    plan, base = plan_segments(lengths[drawn], plan_fn, world_size, segments, seed, epoch,
                               labels=labels, num_sources=mix.num_sources)
    return remap(plan, drawn), base
