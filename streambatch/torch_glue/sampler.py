"""``DynamicBatchSampler``: a drop-in, DDP-safe replacement for the seed sampler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from .distributed import check_same_everywhere, resolve_world
from ..core.plan import Plan, RankBatches, config_fingerprint
from ..planners import check_planner, make_plan
from ..core.validation import check_budget, check_flag, check_int, check_seed, coerce_lengths

_STATE_VERSION = 1


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
            takes them from ``torch.distributed`` (0 and 1 when not initialised).
        planner: ``"greedy"`` (seed-exact) or another registered planner.
        verify: when ``torch.distributed`` is initialised, all-reduce a plan
            fingerprint after each (re)plan and raise on every rank if ranks
            planned differently (for example from different ``lengths``).
        **planner_options: options of the chosen planner.
    """

    def __init__(self, lengths: Any, max_batch_tokens: Any, max_batch_size: int = 64, shuffle: bool = True,
                 drop_last: bool = False, rank: int | None = 0, world_size: int | None = 1, seed: int = 42,
                 *, planner: str = "greedy", verify: bool = True, **planner_options: Any):
        self.lengths = coerce_lengths(lengths)
        self.max_batch_tokens = check_budget(max_batch_tokens)
        self.max_batch_size = check_int("max_batch_size", max_batch_size, 1)
        self.shuffle = check_flag("shuffle", shuffle)
        self.drop_last = check_flag("drop_last", drop_last)
        self.rank, self.world_size = resolve_world(rank, world_size)
        self.seed = check_seed(seed)
        self.planner = check_planner(planner)
        self.verify = check_flag("verify", verify)
        self.planner_options = dict(planner_options)
        self.epoch = 0
        self._start_batch = 0
        self._consumed = 0
        self._fingerprint = config_fingerprint(
            self.lengths, self.max_batch_tokens, self.max_batch_size, self.shuffle, self.drop_last,
            self.world_size, self.seed, self.planner, repr(sorted(self.planner_options.items())))
        self.plan: Plan = self._make_plan()

    def _make_plan(self) -> Plan:
        plan = make_plan(self.lengths, self.max_batch_tokens, self.max_batch_size, self.world_size,
                         self.shuffle, self.drop_last, self.seed, self.epoch, self.planner,
                         **self.planner_options)
        if self.verify:
            check_same_everywhere(plan.fingerprint(), f"the plan of epoch {self.epoch}")
        return plan

    @property
    def batches(self) -> RankBatches:
        """This rank's batches of the current epoch: a lazy ``Sequence[list[int]]``."""
        return self.plan.rank_batches(self.rank)

    @property
    def num_padded(self) -> int:
        """Samples repeated this epoch to fill the final step (<= world_size - 1)."""
        return self.plan.num_padded

    @property
    def num_dropped(self) -> int:
        """Samples left out this epoch by ``drop_last``."""
        return self.plan.num_dropped

    def set_epoch(self, epoch: int) -> None:
        """Plan epoch ``epoch`` (a no-op when it is the planned one)."""
        epoch = check_int("epoch", epoch, 0)
        if epoch == self.epoch:
            return
        self.epoch = epoch
        self._consumed = self._start_batch
        self.plan = self._make_plan()

    def set_start_batch(self, n: int) -> None:
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
        plan, rank = self.plan, self.rank
        for i in range(start, plan.num_steps):
            # count before yielding: a state saved after receiving batch i
            # must resume at i + 1
            self._consumed = i + 1
            yield plan.batch(i, rank).tolist()

    def __len__(self) -> int:
        return self.plan.num_steps

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: epoch, batches consumed, seed, config fingerprint."""
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "batches_consumed": self._consumed,
            "seed": self.seed,
            "world_size": self.world_size,
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: replan the saved epoch and skip the consumed batches."""
        if not isinstance(state, dict) or not {"epoch", "batches_consumed", "fingerprint"} <= set(state):
            raise ValueError(f"not a DynamicBatchSampler state (expected keys epoch, batches_consumed, "
                             f"fingerprint): {state!r}")
        if state.get("world_size", self.world_size) != self.world_size:
            raise ValueError(f"the state was saved with world_size={state['world_size']} but this sampler has "
                             f"world_size={self.world_size}; resume with the same world size")
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"the state was saved with seed={state['seed']} but this sampler has seed={self.seed}")
        if state["fingerprint"] != self._fingerprint:
            raise ValueError("the state was saved for a different configuration (lengths, budget, batch-size cap, "
                             "shuffle, drop_last or planner differ); resume with the sampler arguments of the run "
                             "that saved it")
        self.set_epoch(state["epoch"])
        self.set_start_batch(state["batches_consumed"])
