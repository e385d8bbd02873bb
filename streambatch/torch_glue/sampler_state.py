"""Saving and resuming ``DynamicBatchSampler``: ``state_dict`` /
``load_state_dict`` (keys in ``streambatch.core.state``), including an
elastic resume at another world size (``epoch/elastic.py``)."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from ..core import state as S
from ..core.config import PlanConfig, check_epoch
from ..core.mix import Mix
from ..core.plan import Plan
from ..core.state import differences, max_world, read_state, state_int
from ..epoch.elastic import Segments, history_digest, read_history, resize
from .prefetch import warn_if_ahead

if TYPE_CHECKING:
    import weakref

    from ..epoch.windows import Window

KIND = "DynamicBatchSampler"


class SamplerStateMixin:
    """The state methods of ``DynamicBatchSampler``."""

    # set by DynamicBatchSampler.__init__
    config: PlanConfig
    plan: Plan
    epoch: int
    mix: Mix | None
    _fingerprint: int
    _segments: Segments
    _base: int
    _start_batch: int
    _consumed: int
    _prefetcher: weakref.ref | None
    _prefetch_start: int

    if TYPE_CHECKING:
        seed: int
        world_size: int

        def source_positions(self) -> list[tuple[int, int]]: ...

        def _fingerprint_at(self, world_size: int) -> int: ...

        def _plan(self, epoch: int, segments: Segments = ()) -> Window: ...

        def _fp(self, plan: Plan) -> int: ...

        def _agree(self, values: dict[str, int], what: str, failure: BaseException | None) -> None: ...

        def _switch(self, epoch: int, plan: Plan, fp: int, segments: Segments = (), base: int = 0) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: epoch, steps consumed, world size, seed,
        configuration and its fingerprint (see ``streambatch.core.state``).

        Under a plain ``DataLoader(num_workers > 0)`` the loader draws batches
        ahead of the training loop, so this count is ahead of what the loop
        has received (a warning says so); use torchdata's
        ``StatefulDataLoader``, or save your own step count and resume with
        ``set_epoch`` + ``set_start_batch``.

        Nothing in it depends on the rank: every rank's state is the same,
        and any one resumes all ranks, at this or another world size."""
        warn_if_ahead(self._prefetcher, self._prefetch_start, self._consumed, self.epoch)
        state = {
            S.VERSION: S.STATE_VERSION,
            S.EPOCH: self.epoch,
            S.STEP: self._consumed,
            S.SEED: self.seed,
            S.WORLD_SIZE: self.world_size,
            S.FINGERPRINT: self._fingerprint,
            S.CONFIG: self.config.describe(),
            S.PLANS: S.PLAN_GENERATION,
        }
        if self._segments:
            state[S.SEGMENTS] = [list(seg) for seg in self._segments]
            state[S.HISTORY] = history_digest(self._fingerprint, self.epoch, self._segments)
        if self.mix is not None:
            state[S.SOURCES] = [list(p) for p in self.source_positions()]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: replan the saved epoch and skip the consumed steps.

        A state saved at another world size resumes elastically: the steps it
        ran stay done and the rest of the epoch is planned for this world
        (``epoch/elastic.py``): every sample once, equal steps per rank.
        Everything is checked before anything changes (a refused state leaves
        the sampler as it was), and every value is bounded, the elastic
        history checked against its digest, before any planning
        (``core/state.py``). Accepts version-1 states (``batches_consumed``).
        With ``verify`` under torch.distributed this is a collective, which
        also checks that every rank loaded the same state."""
        failure, plan, epoch, step, fp = None, self.plan, self.epoch, 0, 0
        segments, base = self._segments, self._base
        try:
            s = read_state(state, KIND, (S.EPOCH, S.STEP, S.FINGERPRINT))
            # Every value is checked before any planning (core/state.py): N bounds the epoch's steps.
            n = self.mix.samples_per_epoch if self.mix is not None else int(self.lengths.shape[0])
            worlds = max_world(n, self.world_size)
            saved_world = state_int(s, S.WORLD_SIZE, 1, worlds) if S.WORLD_SIZE in s else self.world_size
            if S.SEED in s and (isinstance(s[S.SEED], bool) or not isinstance(s[S.SEED], numbers.Integral)):
                raise ValueError(f"state['seed'] must be an integer, got {s[S.SEED]!r:.100}")
            if S.SEED in s and s[S.SEED] != self.seed:
                raise ValueError(f"the state was saved with seed={s[S.SEED]} but this sampler has seed={self.seed}")
            # everything but the world size must match: compare at the saver's world size
            if s[S.FINGERPRINT] != self._fingerprint_at(saved_world):
                saved = dict(s.get(S.CONFIG) or {}, world_size=self.world_size)
                what = differences(saved, self.config.describe()) or ("the lengths differ" if self.mix is None
                                                                       else "the lengths or the mix differ")
                raise ValueError(f"the state was saved for a different configuration ({what}); resume with the "
                                 "lengths and sampler arguments of the run that saved it")
            epoch = check_epoch(state_int(s, S.EPOCH, 0, S.MAX_EPOCH), "state['epoch']")
            saved_segments = read_history(s, epoch, n, worlds)
            step = state_int(s, S.STEP, 0, n, f": beyond the {n} steps of epoch {epoch} at most (one or more of its "
                                              f"{n} samples each)")
            done = sum(k for _, k in saved_segments)
            if step < done:
                raise ValueError(f"state['step'] = {step} is below the {done} steps of state['segments']; "
                                 f"{S.DAMAGED}")
            # from another world size: the saver's run becomes a finished segment
            segments = resize(saved_segments, saved_world, step, done, self.world_size)
            if epoch != self.epoch or segments != self._segments:
                ep = self._plan(epoch, segments)
                plan, base = ep.plan, ep.first_step
            if step > base + plan.num_steps:
                raise ValueError(f"state['step'] = {step} is beyond the {base + plan.num_steps} steps of epoch "
                                 f"{epoch}; the state does not belong to this sampler's plan")
            fp = self._fp(plan) ^ base
            S.warn_if_replanned(s, "DynamicBatchSampler", self.config.planner, epoch, step)
        except Exception as exc:
            failure = exc
        self._agree({"fingerprint": fp, "epoch": epoch, "start batch": step},
                    f"the resumed plan (epoch {epoch}, step {step})", failure)
        self._switch(epoch, plan, fp ^ base, segments, base)
        self._start_batch = self._consumed = step
