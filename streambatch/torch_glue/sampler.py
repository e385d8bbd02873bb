"""``DynamicBatchSampler``: a drop-in, DDP-safe replacement for the seed sampler."""

from __future__ import annotations

import dataclasses
import logging
import numbers
import sys
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ..core import state as S
from ..core.config import PlanConfig, check_epoch
from ..core.hashing import hash_array
from ..core.long_samples import check_max_length, too_long
from ..core.plan import Plan, RankBatches
from ..core.state import differences, read_state, state_int
from ..core.validation import check_flag, check_int, coerce_lengths
from ..planners import plan_epoch
from .distributed import active, agree, resolve_world, will_check

KIND = "DynamicBatchSampler"
log = logging.getLogger("streambatch.sampler")


class DynamicBatchSampler(Sampler[list[int]]):
    """Token-budget batches of sample indices for ``DataLoader(batch_sampler=...)``.

    Plans *global steps*: each step holds one batch per rank, balanced under a
    B * L**2 cost; every rank yields the same number of batches. With the
    default ``planner="greedy"`` the batches are those of the VoxCPM seed
    sampler, batch for batch (see the README for the one documented difference:
    the final step is padded so no rank runs short).

    Args:
        lengths: (N,) per-sample lengths (list, numpy array or torch tensor).
        max_batch_tokens: budget for batch size x longest length.
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
            units) are left out of every batch (``long_samples="drop"``,
            counted in ``num_too_long`` and logged; ``len(dataset)`` is
            unchanged, their indices just never appear) or make the
            constructor raise (``"raise"``). None (default): no limit.
        **planner_options: options of the chosen planner.
    """

    def __init__(self, lengths: Any, max_batch_tokens: Any, max_batch_size: Any = 64, shuffle: Any = True,
                 drop_last: Any = False, rank: Any = 0, world_size: Any = 1, seed: Any = 42,
                 *, planner: str = "greedy", verify: Any = True, max_length: Any = None,
                 long_samples: str = "drop", **planner_options: Any):
        failure = plan = None
        world: Any = world_size
        try:
            self.verify = check_flag("verify", verify)
            self.rank, world = resolve_world(rank, world_size)
            self.config = PlanConfig.build(max_batch_tokens, max_batch_size, world, shuffle, drop_last, seed,
                                           planner, planner_options)
            self.lengths = coerce_lengths(lengths)
            self.max_length, self.long_samples = check_max_length(max_length, long_samples)
            over = too_long(self.lengths, self.max_length, self.long_samples)
            # Planned sample i is dataset index _kept[i]; None: every sample is planned.
            self._kept = np.delete(np.arange(self.lengths.size), over) if over.size else None
            self.num_too_long = int(over.size)
            if over.size:
                log.warning("DynamicBatchSampler: %d of %d samples are longer than max_length=%d and are left out "
                            "of every batch", over.size, self.lengths.size, self.max_length)
            self._fingerprint = self.config.fingerprint(self.lengths)
            if self.max_length is not None:  # part of the configuration only when set: old states still load
                mark = np.array([self.max_length, self.long_samples == "raise"], dtype=np.int64)
                self._fingerprint = int(hash_array(mark, np.uint64(self._fingerprint))) >> 1
            plan = self._plan_epoch(0)
        except Exception as exc:  # re-raised below, after every rank has heard of it
            failure = exc
        self._plan_fp: int | None = None  # the plan's fingerprint, computed when a check needs it
        if will_check(verify, world):
            self._plan_fp = plan.fingerprint() if failure is None else 0
            agree({"fingerprint": self._plan_fp, "epoch": 0, "start batch": 0}, "the plan of epoch 0", failure)
        elif failure is not None:
            raise failure
        self.plan: Plan = plan
        self.epoch = 0
        self._start_batch = 0
        self._consumed = 0
        # a weak reference to the torch multi-worker DataLoader iterator drawing
        # from us, and the batch it started at (to tell when a state is ahead)
        self._prefetcher: Any = None
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

    def _plan_epoch(self, epoch: int) -> Plan:
        """The plan of ``epoch``, in dataset indices (samples over max_length left out)."""
        kept = self._kept
        plan = plan_epoch(self.lengths if kept is None else self.lengths[kept], self.config, epoch)
        if kept is not None:  # back to dataset indices
            leftover = None if plan.leftover is None else kept[plan.leftover]
            plan = dataclasses.replace(plan, samples=kept[plan.samples], leftover=leftover)
        return plan

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

    def _switch(self, epoch: int, plan: Plan, fp: int) -> None:
        if plan is not self.plan:
            self.epoch, self.plan, self._plan_fp = epoch, plan, fp or None

    @property
    def batches(self) -> RankBatches:
        """This rank's batches of the current epoch: a lazy ``Sequence[list[int]]``."""
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

    # ------------------------------------------------------------ epochs

    def set_epoch(self, epoch: Any) -> None:
        """Plan epoch ``epoch`` (no replanning when it is the planned one).

        With ``verify`` under torch.distributed this is a collective every
        time, so ranks that disagree on the epoch or start batch raise."""
        failure, plan, fp = None, self.plan, 0
        try:
            epoch = check_epoch(epoch)
            if epoch != self.epoch:
                plan = self._plan_epoch(epoch)
            fp = self._fp(plan)
        except Exception as exc:
            failure = exc
        self._agree({"fingerprint": fp, "epoch": epoch if failure is None else 0, "start batch": self._start_batch},
                    f"the plan of epoch {epoch}", failure)
        if plan is not self.plan:
            self._switch(epoch, plan, fp)
            self._consumed = self._start_batch

    def set_start_batch(self, n: Any) -> None:
        """Skip the first ``n`` batches on the next ``__iter__`` (consumed once)."""
        n = check_int("start batch", n, 0)
        if n > len(self):
            raise ValueError(f"start batch must be in [0, {len(self)}] (batches in epoch {self.epoch}), got {n}; "
                             "call set_epoch first if the position belongs to another epoch")
        self._start_batch = n
        self._consumed = n

    def __iter__(self) -> Iterator[list[int]]:
        start = self._start_batch
        self._start_batch = 0
        self._consumed = start
        # This body runs on the first next(): the caller's frame tells whether
        # a multi-worker DataLoader is drawing batches ahead of the training loop.
        self._prefetcher = _prefetching_loader(sys._getframe(1))
        self._prefetch_start = start
        plan, rank = self.plan, self.rank
        for i in range(start, plan.num_steps):
            # count before yielding: a state saved after receiving batch i
            # must resume at i + 1
            self._consumed = i + 1
            yield plan.batch(i, rank).tolist()

    def __len__(self) -> int:
        return self.plan.num_steps

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: epoch, steps consumed, world size, seed,
        configuration and its fingerprint (see ``streambatch.core.state``).

        Under a plain ``DataLoader(num_workers > 0)`` the loader draws batches
        ahead of the training loop, so this count is ahead of what the loop
        has received (a warning says so); use torchdata's
        ``StatefulDataLoader``, or save your own step count and resume with
        ``set_epoch`` + ``set_start_batch``."""
        self._warn_if_ahead()
        return {
            S.VERSION: S.STATE_VERSION,
            S.EPOCH: self.epoch,
            S.STEP: self._consumed,
            S.SEED: self.seed,
            S.WORLD_SIZE: self.world_size,
            S.FINGERPRINT: self._fingerprint,
            S.CONFIG: self.config.describe(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: replan the saved epoch and skip the consumed steps.

        Everything is checked before anything changes (a refused state leaves
        the sampler as it was). Accepts version-1 states (``batches_consumed``).
        With ``verify`` under torch.distributed this is a collective."""
        failure, plan, epoch, step, fp = None, self.plan, self.epoch, 0, 0
        try:
            s = read_state(state, KIND, (S.EPOCH, S.STEP, S.FINGERPRINT))
            if S.WORLD_SIZE in s and state_int(s, S.WORLD_SIZE, 1) != self.world_size:
                raise ValueError(f"the state was saved with world_size={s[S.WORLD_SIZE]} but this sampler has "
                                 f"world_size={self.world_size}; resume with the same world size")
            if S.SEED in s and (isinstance(s[S.SEED], bool) or not isinstance(s[S.SEED], numbers.Integral)):
                raise ValueError(f"state['seed'] must be an integer, got {s[S.SEED]!r}")
            if S.SEED in s and s[S.SEED] != self.seed:
                raise ValueError(f"the state was saved with seed={s[S.SEED]} but this sampler has seed={self.seed}")
            if s[S.FINGERPRINT] != self._fingerprint:
                what = differences(s.get(S.CONFIG), self.config.describe()) or "the lengths differ"
                raise ValueError(f"the state was saved for a different configuration ({what}); resume with the "
                                 "lengths and sampler arguments of the run that saved it")
            epoch = check_epoch(state_int(s, S.EPOCH), "state['epoch']")
            if epoch != self.epoch:
                plan = self._plan_epoch(epoch)
            step = state_int(s, S.STEP)
            if step > plan.num_steps:
                raise ValueError(f"state['step'] = {step} is beyond the {plan.num_steps} steps of epoch {epoch}; "
                                 "the state does not belong to this sampler's plan")
            fp = self._fp(plan)
        except Exception as exc:
            failure = exc
        self._agree({"fingerprint": fp, "epoch": epoch, "start batch": step},
                    f"the resumed plan (epoch {epoch}, step {step})", failure)
        self._switch(epoch, plan, fp)
        self._start_batch = self._consumed = step

    def _warn_if_ahead(self) -> None:
        it = self._prefetcher() if self._prefetcher is not None else None
        received = getattr(it, "_num_yielded", None)
        if received is None:
            return
        received += self._prefetch_start
        if received < self._consumed:
            warnings.warn(
                f"DynamicBatchSampler.state_dict() read while a DataLoader with {getattr(it, '_num_workers', '?')} "
                f"workers prefetches from it: the sampler has handed out {self._consumed} batches of epoch "
                f"{self.epoch}, the loop has received {received}. Resuming from this state would skip "
                f"{self._consumed - received} batches: use torchdata's StatefulDataLoader, or save your own step "
                "count and resume with set_epoch(epoch) + set_start_batch(step)", RuntimeWarning, stacklevel=3)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_prefetcher"] = None  # a weak reference to a live iterator does not travel
        return state


def _prefetching_loader(frame: Any) -> Any:
    """A weak reference to the torch multi-worker DataLoader iterator whose
    ``next(sampler_iter)`` is running in ``frame``, else None. (torchdata's
    StatefulDataLoader has its own iterator classes and saves exact states.)"""
    if frame is None:
        return None
    try:
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    except ImportError:
        return None
    it = frame.f_locals.get("self")
    return weakref.ref(it) if isinstance(it, _MultiProcessingDataLoaderIter) else None
