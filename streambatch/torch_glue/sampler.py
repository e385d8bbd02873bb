"""``DynamicBatchSampler``: a drop-in, DDP-safe replacement for the seed sampler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from .distributed import check_same_everywhere, resolve_world
from ..core.mix import Mix, specs_from
from ..core.plan import Plan, RankBatches, config_fingerprint
from ..planners import check_planner, make_plan
from ..planners.elastic import Segments, check_segments, resize
from ..planners.epoch import plan_epoch_steps
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
        mix: a ``Mix`` over sources concatenated in ``lengths`` (see
            ``DynamicBatchSampler.mixed``, which builds it); each epoch then
            plans the mix's draw instead of every sample once.
        verify: when ``torch.distributed`` is initialised, all-reduce a plan
            fingerprint after each (re)plan and raise on every rank if ranks
            planned differently (for example from different ``lengths``).
        **planner_options: options of the chosen planner.
    """

    def __init__(self, lengths: Any, max_batch_tokens: Any, max_batch_size: int = 64, shuffle: bool = True,
                 drop_last: bool = False, rank: int | None = 0, world_size: int | None = 1, seed: int = 42,
                 *, planner: str = "greedy", verify: bool = True, mix: Mix | None = None, **planner_options: Any):
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
        if mix is not None:
            if not isinstance(mix, Mix):
                raise TypeError(f"mix must be a streambatch Mix (see DynamicBatchSampler.mixed), got {mix!r:.100}")
            if sum(mix.sizes) != self.lengths.shape[0]:
                raise ValueError(f"the mix's sources hold {sum(mix.sizes)} samples but lengths has "
                                 f"{self.lengths.shape[0]}; pass the sources' lengths concatenated in order")
        self.mix = mix
        self.epoch = 0
        self._start_batch = 0
        self._consumed = 0
        self._segments: Segments = ()  # elastic history of the current epoch
        self._base = 0  # epoch steps run by earlier world sizes
        self._fingerprint = self._fingerprint_at(self.world_size)
        self.plan: Plan = self._make_plan()

    @classmethod
    def mixed(cls, sources: Any, max_batch_tokens: Any, max_batch_size: int = 64, *, weights: Any = None,
              samples: Any = None, repeats: Any = None, samples_per_epoch: Any = None,
              **kwargs: Any) -> DynamicBatchSampler:
        """A sampler over several sources mixed by weight, count or repeat.

        sources: a list of per-source lengths; the sampler yields indices into
            their concatenation (the order of ``ConcatDataset(datasets)``).
        weights: per-source shares; an epoch draws ``samples_per_epoch``
            (default: all sources' samples) split by weight. Or ``samples``
            (per-source counts per epoch) or ``repeats`` (per-source factors);
            none: every sample once. Each source is read in cycles, a fresh
            order per cycle, every sample once per cycle; an epoch continues
            where the last stopped (see ``streambatch.core.mix``).
        kwargs: the constructor's other arguments (shuffle, rank, seed, planner...).
        """
        if isinstance(sources, (str, bytes)) or not hasattr(sources, "__len__") or len(sources) == 0:
            raise ValueError(f"sources must be a non-empty list of per-source lengths, got {sources!r:.100}")
        arrays = [coerce_lengths(x) for x in sources]
        mix = Mix.build([a.shape[0] for a in arrays], specs_from(len(arrays), weights, samples, repeats),
                        samples_per_epoch)
        return cls(np.concatenate(arrays), max_batch_tokens, max_batch_size, mix=mix, **kwargs)

    def _fingerprint_at(self, world_size: int) -> int:
        """The configuration fingerprint a sampler like this one has at ``world_size``."""
        values = [self.max_batch_tokens, self.max_batch_size, self.shuffle, self.drop_last, world_size, self.seed,
                  self.planner, repr(sorted(self.planner_options.items()))]
        if self.mix is not None:
            values.append(self.mix.key())
        return config_fingerprint(self.lengths, *values)

    def _plan_fn(self, lengths: np.ndarray, world_size: int, seed: int, epoch: int) -> Plan:
        return make_plan(lengths, self.max_batch_tokens, self.max_batch_size, world_size, self.shuffle,
                         self.drop_last, seed, epoch, self.planner, **self.planner_options)

    def _make_plan(self, segments: Segments | None = None) -> Plan:
        """Plan the current epoch (after ``segments``, default the current
        history); sets ``_base`` and, if given, ``_segments`` once it succeeded."""
        segs = self._segments if segments is None else segments
        ep = plan_epoch_steps(self.lengths, self._plan_fn, self.world_size, self.seed, self.epoch, mix=self.mix,
                              shuffle=self.shuffle, segments=segs)
        if self.verify:
            check_same_everywhere(ep.plan.fingerprint() ^ ep.base, f"the plan of epoch {self.epoch}")
        self._base, self._segments = ep.base, segs
        return ep.plan

    def source_positions(self) -> list[tuple[int, int]]:
        """Mixing: per source, (cycle, position in it) at the start of the
        current epoch. Without a mix: one source at (epoch, 0)."""
        if self.mix is None:
            return [(self.epoch, 0)]
        return self.mix.positions(self.epoch)

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
        self._segments = ()
        self._consumed = self._start_batch
        self.plan = self._make_plan()

    def set_start_batch(self, n: int) -> None:
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
        start = max(self._start_batch, self._base)
        self._start_batch = 0
        self._consumed = start
        plan, rank, base = self.plan, self.rank, self._base
        for i in range(start, base + plan.num_steps):
            # count before yielding: a state saved after receiving batch i
            # must resume at i + 1
            self._consumed = i + 1
            yield plan.batch(i - base, rank).tolist()

    def __len__(self) -> int:
        """Steps of the current epoch: this rank's batches, plus those run by
        an earlier world size before an elastic resume (``base_step``)."""
        return self._base + self.plan.num_steps

    @property
    def base_step(self) -> int:
        """First epoch step of the current world size (0 unless this epoch
        was resumed from a state saved at another world size)."""
        return self._base

    def state_dict(self) -> dict[str, Any]:
        """Where the run is: epoch, batches consumed, seed, config fingerprint,
        and the epoch's elastic history (``segments``: the (world_size, steps)
        runs before the current world size). Nothing in it depends on the
        rank, so every rank's state is the same and any one resumes all."""
        state = {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "batches_consumed": self._consumed,
            "seed": self.seed,
            "world_size": self.world_size,
            "fingerprint": self._fingerprint,
        }
        if self._segments:
            state["segments"] = [list(seg) for seg in self._segments]
        if self.mix is not None:
            state["sources"] = [list(p) for p in self.source_positions()]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: replan the saved epoch and skip the consumed batches."""
        if not isinstance(state, dict) or not {"epoch", "batches_consumed", "fingerprint"} <= set(state):
            raise ValueError(f"not a DynamicBatchSampler state (expected keys epoch, batches_consumed, "
                             f"fingerprint): {state!r}")
        saved_world = check_int("state['world_size']", state.get("world_size", self.world_size), 1)
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"the state was saved with seed={state['seed']} but this sampler has seed={self.seed}")
        # The fingerprint this configuration has at the saver's world size:
        # everything but the world size must match.
        if state["fingerprint"] != self._fingerprint_at(saved_world):
            raise ValueError("the state was saved for a different configuration (lengths, budget, batch-size cap, "
                             "shuffle, drop_last, planner or mix differ); resume with the sampler arguments of the "
                             "run that saved it")
        epoch = check_int("state['epoch']", state["epoch"], 0)
        step = check_int("state['batches_consumed']", state["batches_consumed"], 0)
        segments = check_segments(state.get("segments"), "state['segments']")
        base = sum(k for _, k in segments)
        if step < base:
            raise ValueError(f"state['batches_consumed'] = {step} is below the {base} steps of its segments")
        # Elastic: a state from another world size records the saver's run as
        # a finished segment; the rest of the epoch is planned for this world.
        segments = resize(segments, saved_world, step, base, self.world_size)
        old_epoch, self.epoch = self.epoch, epoch
        try:
            plan = self._make_plan(segments)
        except ValueError:
            self.epoch = old_epoch
            raise
        self.plan = plan
        self.set_start_batch(step)
