"""Saving and resuming ``StreamingBatches``: ``state_dict`` /
``load_state_dict`` (keys in ``streambatch.core.state``), including a
torchdata ``StatefulDataLoader``'s state and an elastic resume at another
world size (``streaming/epoch/sample_mode.py``).

Stream: ``state_dict()`` / ``load_state_dict()`` of the dataset (the ``core/state.py`` format)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
from torch.utils.data import get_worker_info

from ...core import state as S
from ...core.plan import config_fingerprint
from ...core.types import IntLike
from ...planners.elastic import Segments, history_digest, resize
from ...torch_glue.distributed import active, agree
from ...torch_glue.elastic import SharedSegments, dataset_state_from_loader, is_loader_state
from ..epoch.windows import EpochSummary, WindowConfig
from ..runtime.counters import Position, SharedState, read_position
from ..shards.sources import SourceCatalog


class StateMixin:
    """The state methods of ``StreamingBatches``."""

    # set by StreamingBatches.__init__
    world_size: int
    verify: bool
    fingerprint: int
    config: WindowConfig
    sources: SourceCatalog | None
    _shared: SharedState
    _segments: SharedSegments
    _pos: dict[str, Any] | None
    _local_resume: dict[str, Any] | None

    if TYPE_CHECKING:
        @property
        def epoch(self) -> int: ...

        def source_positions(self, epoch: IntLike | None = None) -> list[tuple[int, int]]: ...

        def _summary(self, epoch: int, segments: Segments) -> EpochSummary: ...

    def state_dict(self) -> dict[str, Any]:
        """Position of this process's latest pass (see ``streambatch.core.state``).

        In the main process (``num_workers=0``) ``step`` counts the batches
        yielded and ``skipped`` the samples skipped by the main process and
        its workers. In a DataLoader worker (as torchdata's StatefulDataLoader
        saves it) ``step`` is the next step this worker yields and
        ``skipped`` what this worker skipped. With a plain DataLoader and
        workers, save your own step count and use ``set_start_batch``.
        """
        pos = self._pos
        if pos is None or pos["epoch"] != self.epoch:
            pending = self._shared.pending(self.epoch)
            segments = self._segments.get(self.epoch)
            start = pending if pending is not None else sum(k for _, k in segments)
            pos = {"epoch": self.epoch, "step": start, "worker": None, "num_workers": 0, "segments": segments}
        worker = pos["worker"]
        state = {S.VERSION: S.STATE_VERSION, S.EPOCH: int(pos["epoch"]), S.STEP: int(pos["step"]), S.WORKER: worker,
                 S.NUM_WORKERS: pos["num_workers"], S.WORLD_SIZE: self.world_size, S.SEED: self.config.seed,
                 S.FINGERPRINT: self.fingerprint, S.CONFIG: self.config.describe(),
                 S.SKIPPED: self._shared.skipped(None if worker is None else SharedState.slot(worker))}
        if pos["segments"]:  # the epoch's runs at earlier world sizes (rank-independent, like the rest)
            state[S.SEGMENTS] = [list(seg) for seg in pos["segments"]]
            state[S.HISTORY] = history_digest(self.fingerprint, int(pos["epoch"]), pos["segments"])
        if self.sources is not None:
            state[S.SOURCES] = [list(p) for p in self.source_positions(pos["epoch"])]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` was saved: the next pass over its epoch
        skips the steps already yielded, planning past them from the sidecar
        lengths without reading their tar data. Everything is checked before
        anything changes, every value bounded (and the elastic history checked
        against its digest) before any planning (``core/state.py``). In the
        main process with ``verify`` under torch.distributed this is a
        collective (all ranks must resume alike).

        ``state`` is any rank's ``state_dict()`` (they are equal) or, in the
        main process, a torchdata ``StatefulDataLoader.state_dict()``. Saved
        at another world size, the rest of the epoch is planned for this one
        (elastic resume, ``streaming/epoch/sample_mode.py``). With DataLoader workers only the
        loader knows where the world stopped (each worker's state holds its
        own next step): load the loader's state here, in the main process,
        before iterating; restoring it into the loader as well is optional."""
        info = get_worker_info()
        failure: BaseException | None = None
        pos: Position | None = None
        segments: Segments = ()
        try:
            if info is None and is_loader_state(state):
                state = dataset_state_from_loader(state)
            pos = read_position(state, self, info)
            done = sum(k for _, k in pos.segments)
            # from another world size: the saver's run becomes a finished segment of the epoch
            segments = resize(pos.segments, pos.world_size, pos.step, done, self.world_size)
            if info is None and pos.world_size != self.world_size:
                self._summary(pos.epoch, segments)  # plans the rest now: a history that does not fit raises here
            elif info is not None and pos.world_size != self.world_size:
                nxt = pos.step + (info.id if pos.worker is None else 0)
                segments = self._prepared(pos.epoch, pos.segments, pos.world_size, nxt, info.num_workers)
        except Exception as exc:
            failure = exc
        if info is None and self.verify and active(self.world_size):
            agree({"fingerprint": self.fingerprint, "epoch": pos.epoch if pos else 0, "step": pos.step if pos else 0,
                   "elastic history": _segments_key(segments)},
                  "the resumed position" + (f" (epoch {pos.epoch}, step {pos.step})" if pos else ""), failure)
        elif failure is not None:
            raise failure
        pos = cast(Position, pos)  # agree() raised on every rank if any failed to read the state
        if pos.worker is not None:
            self._local_resume = {"epoch": pos.epoch, "step": pos.step, "limit": pos.num_workers,
                                  "segments": segments}
        elif info is not None:  # a main-process state loaded inside a worker
            self._local_resume = {"epoch": pos.epoch, "step": pos.step + info.id, "limit": info.num_workers,
                                  "segments": segments}
        else:
            self._segments.set(pos.epoch, segments)
            self._shared.set_resume(pos.epoch, pos.step)
        # A main-process total restored in workers goes to worker 0 alone, so it is counted once.
        mine = pos.skipped if pos.worker is not None or info is None or info.id == 0 else 0
        self._shared.restore_skipped(SharedState.slot(None if info is None else info.id), mine)
        self._pos = None

    def _prepared(self, epoch: int, segments: Segments, saved_world: int, nxt: int, workers: int) -> Segments:
        """In a worker: the history of an elastic resume that the main process
        loaded, checked against this worker's own saved next step ``nxt``."""
        have = self._segments.get(epoch)
        n = len(segments)
        fits = have[:n] == segments and (len(have) == n or (len(have) == n + 1 and have[n][0] == saved_world))
        if not fits or not nxt - workers < sum(k for _, k in have) <= nxt:
            raise ValueError(
                f"this DataLoader worker got a state saved at world_size={saved_world} (this run: "
                f"{self.world_size}); only the loader knows where that world stopped, so load the loader's whole "
                "state into the dataset in the main process first: ds.load_state_dict(loader_state), then "
                "iterate the loader (restoring loader_state into it too is optional)"
            )
        return have

def _segments_key(segments: Segments) -> int:
    """A 63-bit hash of an elastic history (0 for none), for the cross-rank check."""
    if not segments:
        return 0
    return config_fingerprint(np.array([x for seg in segments for x in seg], dtype=np.int64))
