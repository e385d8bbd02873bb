"""``DynamicBatchSampler``: a drop-in, DDP-safe replacement for the seed sampler.

Its state methods live in ``sampler_state.py``, the detection of a
prefetching DataLoader in ``prefetch.py``."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
from torch.utils.data import Sampler

from ..core.config import PlanConfig, check_epoch
from ..core.keywords import REQUIRED
from ..core.long_samples import check_max_length, too_long, warn_over_budget
from ..core.mix import Mix, specs_from
from ..core.plan import Plan, RankBatches
from ..core.redact import logger
from ..core.types import FlagLike, IntLike, LengthsLike, NumberLike
from ..core.validation import check_flag, check_int, coerce_lengths
from ..epoch.elastic import Segments
from ..epoch.epoch_plan import EpochPlan
from ..epoch.windows import Window
from .distributed import SEED_RANK, SEED_WORLD, active, agree, resolve_world, warn_seed_defaults, will_check
from .guard import check_per_rank_sampler
from .prefetch import prefetching_loader
from .preflight import PreflightReport, preflight_sampler
from .sampler_state import SamplerStateMixin

log = logger("streambatch.sampler")


class DynamicBatchSampler(SamplerStateMixin, Sampler[list[int]]):
    """Token-budget batches of sample indices for ``DataLoader(batch_sampler=...)``.

    Plans *global steps*: each step holds one batch per rank, balanced under a
    B * L**2 cost; every rank yields the same number of batches. With the
    default ``planner="greedy"`` the batches are those of the VoxCPM seed
    sampler, batch for batch (see the README for the one documented difference:
    the final step is padded so no rank runs short).

    Args:
        lengths: (N,) per-sample lengths (list, numpy array or torch tensor).
        max_batch_tokens: budget for batch size x longest length (packed
            batches, ``planner="bucketed", pack=True``: for the sum of lengths).
        max_batch_size: cap on samples per batch.
        shuffle, drop_last, seed: as in the seed sampler.
        rank, world_size: this rank and the data-parallel world size; ``None``
            takes them from ``torch.distributed`` (0 and 1 when it is not
            initialised and no launcher started several processes).
        planner: ``"greedy"`` (seed-exact) or another registered planner.
        verify: when ``torch.distributed`` is initialised and world_size > 1,
            check with one small all-reduce at construction, in every
            ``set_epoch`` and in ``load_state_dict`` that all ranks hold the same
            plan, epoch and start position, and raise on every rank if not (or
            if any rank failed to build its plan) instead of hanging. These
            calls are then collectives: make them on every rank.
        max_length, long_samples: samples longer than ``max_length`` (length
            units; None, default: no limit) are left out of every batch
            (counted in ``num_too_long`` and logged; ``len(dataset)`` is
            unchanged, their indices just never appear). Samples longer than
            the budget alone: ``long_samples="warn"`` (default) plans each
            alone, over the budget, with one ``LongSampleWarning`` (their
            count, the longest, the fix); ``"drop"`` leaves them out too
            (counted in ``num_too_long``, warned); ``"raise"`` makes the
            constructor raise for either kind (``core/long_samples.py``).
        mix: a ``Mix`` of sources concatenated in ``lengths`` (built by
            ``DynamicBatchSampler.mixed``); each epoch then plans the mix's
            draw (see ``streambatch.core.mix``) instead of every sample once.
        **planner_options: options of the chosen planner.
    """

    def __init__(self, lengths: LengthsLike, max_batch_tokens: NumberLike = REQUIRED, max_batch_size: IntLike = 64,
                 shuffle: FlagLike = True, drop_last: FlagLike = False, rank: IntLike | None = SEED_RANK,
                 world_size: IntLike | None = SEED_WORLD, seed: IntLike = 42, *, planner: str = "greedy",
                 verify: FlagLike = True, max_length: IntLike | None = None, long_samples: str = "warn",
                 mix: Mix | None = None, **planner_options: Any) -> None:
        failure: BaseException | None = None
        plan: Plan | None = None
        world: Any = world_size  # the caller's value until resolve_world checks it
        self._segments: Segments = ()  # elastic history of the current epoch
        self._base = 0  # steps of the current epoch run at earlier world sizes
        try:
            self.verify = check_flag("verify", verify)
            self.rank, world = resolve_world(rank, world_size)
            if rank is SEED_RANK and world_size is SEED_WORLD:
                warn_seed_defaults(self)
            self.max_length, self.long_samples = check_max_length(max_length, long_samples)
            self.config = PlanConfig.build(max_batch_tokens, max_batch_size, world, shuffle, drop_last, seed,
                                           planner, planner_options, long_samples=self.long_samples)
            self.lengths = coerce_lengths(lengths)
            budget = self.config.max_batch_tokens
            over = too_long(self.lengths, self.max_length, self.long_samples, budget=budget)
            # Planned sample i is dataset index _kept[i]; None: every sample is planned.
            self._kept = np.delete(np.arange(self.lengths.size), over) if over.size else None
            self.num_too_long = int(over.size)
            if over.size and self.max_length is not None:
                log.warning("DynamicBatchSampler: %d of %d samples are longer than max_length=%d%s and are left "
                            "out of every batch", over.size, self.lengths.size, self.max_length,
                            " or max_batch_tokens (long_samples='drop')" if self.long_samples == "drop" else "")
            # over the budget: planned alone ("warn") or left out ("drop"), one warning per sampler (not per
            # epoch: every epoch plans the same samples, or a mix's draw of them)
            warn_over_budget(self.lengths[over] if self.long_samples == "drop" else
                             self.lengths if self._kept is None else self.lengths[self._kept],
                             budget, self.long_samples, "DynamicBatchSampler: ", stacklevel=3)
            self.mix = _check_mix(mix, self.lengths.shape[0])
            # the plan layer's epochs: one in-memory source, one window per epoch
            self._epochs = EpochPlan.in_memory(self.lengths, self.config, mix=self.mix, keep=self._kept,
                                               max_length=self.max_length, long_samples=self.long_samples)
            self._fingerprint = self._fingerprint_at(world)
            plan = self._plan(0).plan
        except Exception as exc:  # re-raised below, after every rank has heard of it
            failure = exc
        self._plan_fp: int | None = None  # the plan's fingerprint, computed when a check needs it
        if will_check(verify, world):
            self._plan_fp = plan.fingerprint() if plan is not None else 0  # a plan exactly when no failure
            agree({"fingerprint": self._plan_fp, "epoch": 0, "start batch": 0}, "the plan of epoch 0", failure,
                  layout=(getattr(self, "rank", 0), world))  # (ignored when this rank failed)
        elif failure is not None:
            raise failure
        self.plan: Plan = cast(Plan, plan)  # agree() raised on every rank if any failed to plan
        self.epoch = 0
        self._start_batch = 0
        self._consumed = 0
        # a weak reference to the torch multi-worker DataLoader iterator drawing
        # from us, and the batch it started at (to tell when a state is ahead)
        self._prefetcher: weakref.ref | None = None
        self._prefetch_start = 0

    # ------------------------------------------------------------ settings

    max_batch_tokens = property(lambda self: self.config.max_batch_tokens)
    max_batch_size = property(lambda self: self.config.max_batch_size)
    world_size = property(lambda self: self.config.world_size)
    shuffle = property(lambda self: self.config.shuffle)
    drop_last = property(lambda self: self.config.drop_last)
    seed = property(lambda self: self.config.seed)
    planner = property(lambda self: self.config.planner)
    planner_options = property(lambda self: self.config.options)

    @classmethod
    def mixed(cls, sources: Sequence[LengthsLike], max_batch_tokens: NumberLike, max_batch_size: IntLike = 64, *,
              weights: Sequence[float] | np.ndarray | None = None,
              samples: Sequence[int] | np.ndarray | None = None,
              repeats: Sequence[float] | np.ndarray | None = None, samples_per_epoch: IntLike | None = None,
              **kwargs: Any) -> DynamicBatchSampler:
        """A sampler over several sources mixed by weight, count or repeat.

        sources: a list of per-source lengths; the sampler yields indices into
            their concatenation (the order of ``ConcatDataset(datasets)``).
        weights: per-source shares; an epoch draws ``samples_per_epoch``
            (default: all sources' samples) split by weight. Or ``samples``
            (per-source counts per epoch) or ``repeats`` (per-source factors);
            none: every sample once. Each source is read in cycles, a fresh
            order per cycle, every sample once per cycle; an epoch continues
            where the last stopped (see ``streambatch.core.mix``). With
            ``max_length``, drawn samples over it are left out of the epoch.
        kwargs: the constructor's other arguments (shuffle, rank, seed, planner...).
        """
        if isinstance(sources, (str, bytes)) or not hasattr(sources, "__len__") or len(sources) == 0:
            raise ValueError(f"sources must be a non-empty list of per-source lengths, got {sources!r:.100}")
        arrays = [coerce_lengths(x) for x in sources]
        mix = Mix.build([a.shape[0] for a in arrays], specs_from(len(arrays), weights, samples, repeats),
                        samples_per_epoch)
        return cls(np.concatenate(arrays), max_batch_tokens, max_batch_size, mix=mix, **kwargs)

    def _fingerprint_at(self, world_size: int) -> int:
        """The state fingerprint a sampler like this one has at ``world_size``."""
        return self._epochs.fingerprint_at(world_size)

    def _plan(self, epoch: int, segments: Segments = ()) -> Window:
        """Epoch ``epoch`` at this world size after ``segments``: its one window
        (``first_step``: where this world's steps begin in the epoch)."""
        return next(self._epochs.windows(epoch, segments))

    def source_positions(self) -> list[tuple[int, int]]:
        """Mixing: per source, (cycle, position in it) at the start of the
        current epoch. Without a mix: one source at (epoch, 0)."""
        return self.mix.positions(self.epoch) if self.mix is not None else [(self.epoch, 0)]

    @property
    def base_step(self) -> int:
        """First epoch step of this world size (0 unless the epoch was resumed
        from a state saved at another world size)."""
        return self._base

    def _checking(self) -> bool:
        return self.verify and active(self.world_size)

    def _fp(self, plan: Plan) -> int:
        """The fingerprint every rank must agree on (0 when no check runs)."""
        if not self._checking():
            return 0
        if plan is not self.plan:
            return plan.fingerprint()
        if self._plan_fp is None:
            self._plan_fp = plan.fingerprint()
        return self._plan_fp

    def _agree(self, values: dict[str, int], what: str, failure: BaseException | None) -> None:
        if self._checking():
            agree(values, what, failure)
        elif failure is not None:
            raise failure

    def _switch(self, epoch: int, plan: Plan, fp: int, segments: Segments = (), base: int = 0) -> None:
        if plan is not self.plan:
            self.epoch, self.plan, self._plan_fp = epoch, plan, fp or None
            self._segments, self._base = segments, base

    @property
    def batches(self) -> RankBatches:
        """This rank's batches of the current epoch: a lazy ``Sequence[list[int]]``
        (after an elastic resume: this world's steps, from ``base_step`` on)."""
        return self.plan.rank_batches(self.rank)

    @property
    def num_padded(self) -> int:
        """Samples repeated this epoch to fill the final step's empty slots
        (<= world_size - 1 slots; one sample may fill several)."""
        return self.plan.num_padded

    @property
    def num_dropped(self) -> int:
        """Samples left out this epoch by ``drop_last``."""
        return self.plan.num_dropped

    def preflight(self, step: Any, **options: Any) -> PreflightReport:
        """Run this epoch's costliest batches and longest clips through ``step(batch_size, length)`` before
        training; raises ``PreflightError`` naming the fix if one does not fit. Reads the plan only (options:
        ``torch_glue.preflight.run_preflight``: memory, limit_bytes, top, longest, device, raise_on_failure)."""
        return preflight_sampler(self, step, **options)

    # ------------------------------------------------------------ epochs

    def set_epoch(self, epoch: IntLike) -> None:
        """Plan epoch ``epoch`` (no replanning when it is the planned one).

        With ``verify`` under torch.distributed this is a collective every
        time, so ranks that disagree on the epoch or start batch raise."""
        failure, plan, fp = None, self.plan, 0
        new = 0  # the checked epoch
        try:
            new = check_epoch(epoch)
            if new != self.epoch:
                plan = self._plan(new).plan
            fp = self._fp(plan)
        except Exception as exc:
            failure = exc
        self._agree({"fingerprint": fp, "epoch": new if failure is None else 0, "start batch": self._start_batch},
                    f"the plan of epoch {epoch}", failure)
        if plan is not self.plan:
            self._switch(new, plan, fp)
            self._consumed = self._start_batch

    def set_start_batch(self, n: IntLike) -> None:
        """Skip the first ``n`` batches on the next ``__iter__`` (consumed once)."""
        n = check_int("start batch", n, 0)
        if n < self._base:
            raise ValueError(f"start batch must be >= {self._base}: this epoch's first {self._base} steps ran at "
                             f"another world size before an elastic resume, got {n}")
        if n > len(self):
            raise ValueError(f"start batch must be in [0, {len(self)}] (batches in epoch {self.epoch}), got {n}; "
                             "call set_epoch first if the position belongs to another epoch")
        self._start_batch = n
        self._consumed = n

    def __iter__(self) -> Iterator[list[int]]:
        # At iter() time, on every process: raise if accelerate would re-deal
        # our per-rank batches (silent data loss otherwise).
        check_per_rank_sampler(self)
        return self._iter_batches()

    def _iter_batches(self) -> Iterator[list[int]]:
        start = max(self._start_batch, self._base)  # an elastic epoch: this world's steps only
        self._start_batch = 0
        self._consumed = start
        # This body runs on the first next(): the caller's frame tells whether
        # a multi-worker DataLoader is drawing batches ahead of the training loop.
        self._prefetcher = prefetching_loader(sys._getframe(1))
        self._prefetch_start = start
        plan, rank, base = self.plan, self.rank, self._base
        for i in range(start, base + plan.num_steps):
            # count before yielding: a state saved after receiving batch i
            # must resume at i + 1
            self._consumed = i + 1
            yield plan.batch(i - base, rank).tolist()

    def __len__(self) -> int:
        """Steps of the current epoch: this rank's batches, plus the steps run
        at an earlier world size before an elastic resume (``base_step``)."""
        return self._base + self.plan.num_steps

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_prefetcher"] = None  # a weak reference to a live iterator does not travel
        return state


def _check_mix(mix: Any, n: int) -> Mix | None:
    if mix is None:
        return None
    if not isinstance(mix, Mix):
        raise TypeError(f"mix must be a streambatch Mix (DynamicBatchSampler.mixed builds one), got {mix!r:.100}")
    if sum(mix.sizes) != n:
        raise ValueError(f"the mix's sources hold {sum(mix.sizes)} samples but lengths has {n}; pass the sources' "
                         "lengths concatenated in order")
    return mix
