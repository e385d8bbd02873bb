"""Batch samplers for Hugging Face accelerate, which deals batches to processes.

``accelerator.prepare(loader)`` wraps the loader's batch sampler in
``BatchSamplerShard``: with ``P`` processes, process ``p`` keeps the batches
``p, p + P, p + 2P, ...`` of whatever the sampler yields. A
``DynamicBatchSampler`` already yields one rank's batches, so that would keep
1/P of them (and it raises instead). The views here yield, for each global
step, the step's ``W`` batches in rank order, so the dealing gives process
``r`` exactly the batches ``DynamicBatchSampler(rank=r)`` yields in a plain DDP
loop. Neither view imports accelerate: they are plain torch batch samplers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import Sampler

from ..core.plan import Plan
from ..torch_glue.guard import check_dealt

if TYPE_CHECKING:
    from ..torch_glue.sampler import DynamicBatchSampler

Segment = tuple[Plan, int, int]  # (plan, first step, stop step), steps in training order


def _check_sampler(sampler: Any) -> None:
    if not all(hasattr(sampler, a) for a in ("plan", "world_size", "set_epoch")):
        raise TypeError(f"expected a streambatch DynamicBatchSampler, got {type(sampler).__name__}; build one with "
                        "world_size = the number of processes (or rank/world_size None under torch.distributed)")


def _deal(segments: list[Segment], world_size: int) -> Iterator[list[int]]:
    """Each step's batches of ranks 0..W-1, step after step."""
    for plan, lo, hi in segments:
        for step in range(lo, hi):
            for rank in range(world_size):
                yield plan.batch(step, rank).tolist()


class GlobalBatchSampler(Sampler[list[int]]):
    """Every rank's batches of each step of the sampler's epoch, in rank order.

    For ``accelerator.prepare`` (``split_batches=False``, the default): with
    ``P = sampler.world_size`` processes each process receives its rank's
    batches, the same as the sampler gives that rank in a plain DDP loop.
    ``len`` is steps x W; the prepared loader's ``len`` is the steps.

    The epoch is the wrapped sampler's: call ``sampler.set_epoch(epoch)``
    before each epoch, as in a plain DDP loop. This view has no ``set_epoch``
    (nor a ``sampler`` attribute) on purpose: accelerate would otherwise set
    the epoch itself from a pass counter that restarts at 0 in a resumed
    process. To resume mid-epoch, set the epoch and either call
    ``accelerator.skip_first_batches(loader, n)`` (``n`` batches this process
    already took in the epoch) or use ``DataLoaderConfiguration(
    use_stateful_dataloader=True)`` with ``save_state``/``load_state``.

    Under ``torch.distributed`` with several processes it must be dealt out
    by accelerate; iterating it in a plain DDP loop raises ``ValueError``
    (every rank would train on every batch).

    sampler: a ``DynamicBatchSampler`` planned for ``world_size`` = the number
        of processes (build it with ``rank=None, world_size=None``: its rank
        does not change the batches dealt here, but under torch.distributed
        the ranks must still be the processes' own, each once).
    """

    def __init__(self, sampler: DynamicBatchSampler) -> None:
        _check_sampler(sampler)
        self.base = sampler

    @property
    def world_size(self) -> int:
        return self.base.world_size

    def __len__(self) -> int:
        # the plan's steps: after an elastic resume, this world size's part of the epoch
        return self.base.plan.num_steps * self.base.world_size

    def __iter__(self) -> Iterator[list[int]]:
        check_dealt(self, self.base.world_size)  # at iter(): on every process, before any batch
        plan = self.base.plan
        return _deal([(plan, 0, plan.num_steps)], self.base.world_size)


class FixedLengthEpochs(Sampler[list[int]]):
    """A global view in epochs of a fixed number of steps, for trainers that
    read ``len()`` once and assume every epoch has that many steps (the Hugging
    Face ``Trainer`` computes epochs, its learning-rate schedule and its resume
    position from it).

    Planned epochs differ by a few steps (the plan depends on the epoch's
    shuffle). This view lays the planned epochs 0, 1, 2, ... end to end and
    cuts the sequence into epochs of ``steps`` global steps (the length of
    planned epoch 0): epoch ``j`` is steps ``[j * steps, (j + 1) * steps)`` of
    the sequence. So every planned epoch is delivered whole and in order
    (each sample once per planned epoch, nothing dropped), the trainer's epochs
    all have the same length, and the position is a function of (epoch, batch)
    alone, which is how the ``Trainer`` resumes. Epoch boundaries drift from
    planned-epoch boundaries by the few steps the plans differ.

    ``set_epoch(j)`` selects the trainer's epoch ``j``; at the start of each
    pass the view plans the (one to three) planned epochs that epoch ``j``
    covers, with the wrapped sampler's ``set_epoch`` (on every rank: with
    ``verify`` it is a collective). Locating epoch ``j`` in a new process plans
    epochs ``0..j`` once each to count their steps.
    """

    def __init__(self, sampler: DynamicBatchSampler) -> None:
        _check_sampler(sampler)
        self.base = sampler
        self.epoch = 0
        self._steps: list[int] = []  # steps of planned epochs 0, 1, ... (as far as counted)
        self.steps = self._planned_steps(0)
        if self.steps == 0:
            raise ValueError("the sampler plans no steps (too few samples for drop_last=True?); nothing to train on")

    @property
    def world_size(self) -> int:
        return self.base.world_size

    def set_epoch(self, epoch: int) -> None:
        """Select the trainer's epoch ``epoch`` for the next pass."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps * self.base.world_size

    def _plan(self, planned_epoch: int) -> Plan:
        self.base.set_epoch(planned_epoch)
        plan = self.base.plan
        if planned_epoch == len(self._steps):
            self._steps.append(plan.num_steps)
        return plan

    def _planned_steps(self, planned_epoch: int) -> int:
        while len(self._steps) <= planned_epoch:
            self._plan(len(self._steps))
        return self._steps[planned_epoch]

    def segments(self, epoch: int) -> list[Segment]:
        """The (plan, first step, stop step) pieces that make up ``epoch``."""
        position, planned = epoch * self.steps, 0
        while position >= self._planned_steps(planned):
            position -= self._steps[planned]
            planned += 1
        out: list[Segment] = []
        left = self.steps
        while left > 0:
            plan = self._plan(planned)
            take = min(plan.num_steps - position, left)
            out.append((plan, position, position + take))
            left -= take
            planned, position = planned + 1, 0
        return out

    def __iter__(self) -> Iterator[list[int]]:
        check_dealt(self, self.base.world_size)  # at iter(): on every process, before any batch
        # Plan everything this pass needs before the first batch, so that the
        # sampler's verification collectives run when every rank starts the
        # pass, not in the middle of one (where they would interleave with DDP).
        return _deal(self.segments(self.epoch), self.base.world_size)
