"""This rank's steps: where each pass of a ``StreamingBatches`` starts, and
the stage that turns an epoch's windows into this process's steps.

Every rank yields every step of the epoch (``len(ds)`` batches, its own
batch of each step); DataLoader worker w of N yields steps w, w + N, ...
(the loader's in-order round robin restores step order, so batches do not
depend on N). A pass starts at the epoch's first step, at a resume position
(``set_start_batch``, ``load_state_dict``), or after the steps of an
elastic history's earlier worlds.

``Progress`` keeps the epoch, a pending resume, the elastic history and the
skip counters in shared memory (``runtime/counters.py``,
``torch_glue/elastic.py``): ``set_epoch`` and a main-process
``load_state_dict`` happen while persistent DataLoader workers hold copies
of the dataset, and skips in workers must be counted where the user looks.
Each pass gets a ``Cursor``, its position (the state a StatefulDataLoader
saves per worker), which the pass moves on as it delivers batches.

Stream: ``RankWindow`` per planned window: this process's steps of it and their batches (sample indices)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core import state as S
from ...epoch.elastic import Segments, history_digest
from ...epoch.windows import Window
from ...torch_glue.elastic import SharedSegments
from ..runtime.counters import SharedState


def lookahead(items: Iterable, enabled: bool = True) -> Iterator[tuple[Any, Any]]:
    """(item, next item or None) pairs; with ``enabled=False`` never peeks
    (next is always None), so a lazy iterable stays lazy."""
    it = iter(items)
    if not enabled:
        for x in it:
            yield x, None
        return
    sentinel = object()
    cur = next(it, sentinel)
    while cur is not sentinel:
        nxt = next(it, sentinel)
        yield cur, (None if nxt is sentinel else nxt)
        cur = nxt


@dataclass(frozen=True)
class RankWindow:
    """One planned window as this process reads it: ``steps`` (epoch step
    indices, possibly none) and, per step, ``batches``: (k,) int64 window
    sample indices of this rank's batch. ``next``: the window after it, when
    the pass peeks ahead (remote prefetch), else None."""

    window: Window
    next: Window | None
    steps: range
    batches: list[np.ndarray]


class Cursor:
    """One pass's position: its epoch, the next step it yields (``step``,
    moved on by ``stride`` = the DataLoader's workers as batches are
    delivered), its worker (None: the main process; ``num_workers`` 0 then)
    and the epoch's elastic history. ``limit``: how far past the epoch's
    last step a resumed start may lie (a worker's own next step)."""

    def __init__(self, epoch: int, step: int, worker: int | None, num_workers: int, segments: Segments,
                 limit: int = 0):
        self.epoch, self.step, self.worker, self.num_workers = epoch, step, worker, num_workers
        self.segments, self.limit = segments, limit
        self.start = step
        self.total = 0  # steps of the epoch's windows seen so far

    @property
    def stride(self) -> int:
        return self.num_workers or 1

    @property
    def slot(self) -> int:
        """This process's skip-counter slot (``SharedState``)."""
        return SharedState.slot(self.worker)

    def windows(self, windows: Iterable[Window], rank: int, peek: bool = False) -> Iterator[RankWindow]:
        """This process's steps of each window, from ``start`` on (windows
        before it yield no steps: planned from lengths only, no tar read)."""
        for win, nxt in lookahead(windows, peek):
            self.total = win.first_step + win.num_steps
            steps = win.worker_steps(self.start, self.stride)
            yield RankWindow(win, nxt, steps, [win.plan.batch(s - win.first_step, rank) for s in steps])

    def deliver(self, batches: Iterable[tuple[int, Any]]) -> Iterator[Any]:
        """(epoch step, batch) -> batch, moving this position past each step
        as its batch goes out; after the last, ``check_end``."""
        for step, batch in batches:
            self.step = step + self.stride
            yield batch
        self.check_end()

    def check_end(self) -> None:
        """After the last window: a start beyond the epoch is a state or start batch of another dataset."""
        if self.start > self.total + self.limit:
            raise ValueError(f"resuming at step {self.start} of epoch {self.epoch}, which has only {self.total} "
                             "steps: the state or start batch does not belong to this dataset")


WORKERS_HOLD = (
    "StreamingBatches.state_dict() was called in the main process after DataLoader workers began the pass over "
    "epoch {epoch}: the workers hold the position, the main process cannot know it (this state says the pass's "
    "start, and resuming from it would train the batches trained since again). Save the position one of three ways: "
    "torchdata's StatefulDataLoader(ds, batch_size=None, num_workers=N) and its loader.state_dict(); or count the "
    "batches your loop took and resume with ds.set_epoch(epoch) and ds.set_start_batch(step); or iterate with "
    "num_workers=0, where ds.state_dict() is exact. Between epochs, call ds.set_epoch(next_epoch) first: the "
    "state then says where that epoch starts (docs/guide/resume.md)")


class Progress:
    """The position of a dataset across passes and processes (see the module
    docstring); ``fingerprint`` binds a saved elastic history (``history``)."""

    def __init__(self, fingerprint: int = 0) -> None:
        self.fingerprint = fingerprint
        self.shared = SharedState()
        self.history = SharedSegments()  # the elastic history of a resumed epoch
        self.cursor: Cursor | None = None  # the latest pass of this process
        self._local_resume: dict[str, Any] | None = None  # a state loaded inside a DataLoader worker

    @property
    def epoch(self) -> int:
        return self.shared.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.shared.epoch = epoch

    def segments(self, epoch: int) -> Segments:
        """The elastic history of ``epoch`` (empty unless a state set one)."""
        return self.history.get(epoch)

    def set_start(self, start: int) -> None:
        """The next pass over the current epoch starts at ``start`` (checked by the caller)."""
        self.shared.set_resume(self.epoch, start)
        self.cursor = None

    def begin(self, worker: int | None, num_workers: int) -> Cursor:
        """The cursor of a pass starting now in this process (DataLoader
        worker ``worker`` of ``num_workers``, or the main process: None, 0)."""
        stride = num_workers or 1
        if self._local_resume is not None:
            r, self._local_resume = self._local_resume, None
            cursor = Cursor(r["epoch"], r["step"], worker, num_workers, r["segments"], r["limit"])
        else:
            epoch = self.epoch
            segments = self.history.get(epoch)
            resume = self.shared.claim(epoch, worker, stride)
            # an elastically resumed epoch: this world's steps start after the earlier worlds'
            start = (resume if resume is not None else sum(k for _, k in segments)) + (worker or 0)
            cursor = Cursor(epoch, start, worker, num_workers, segments, 0 if worker is None else stride)
        # A later set_start_batch or load_state_dict replaces self.cursor without breaking a pass still running.
        self.cursor = cursor
        self.shared.pass_began(cursor.epoch, worker)
        return cursor

    def add_skip(self, cursor: Cursor) -> int:
        """Count a sample skipped by ``cursor``'s process; returns its count so far."""
        self.shared.add_skip(cursor.slot)
        return self.shared.skipped(cursor.slot)

    def skipped(self) -> int:
        """Samples skipped by this rank: every process, plus those restored from a state."""
        return self.shared.skipped()

    def state_dict(self, main: bool = True) -> dict[str, Any]:
        """The position part of the dataset's state (``core/state.py`` keys):
        the latest pass's, or where the next pass over the current epoch starts.
        ``main``: asked in the main process, which warns when DataLoader workers
        began the epoch's pass since it last set a position (only they know it)."""
        c = self.cursor
        if main and self.shared.workers_hold(self.epoch):
            # (a warning, as the sampler's when a loader prefetches: the state is still the epoch's and settings')
            warnings.warn(WORKERS_HOLD.format(epoch=self.epoch), RuntimeWarning, stacklevel=3)
        if c is None or c.epoch != self.epoch:
            pending = self.shared.pending(self.epoch)
            segments = self.history.get(self.epoch)
            start = pending if pending is not None else sum(k for _, k in segments)
            c = Cursor(self.epoch, start, None, 0, segments)
        state = {S.EPOCH: int(c.epoch), S.STEP: int(c.step), S.WORKER: c.worker, S.NUM_WORKERS: c.num_workers,
                 S.SKIPPED: self.shared.skipped(None if c.worker is None else c.slot)}
        if c.segments:  # the epoch's runs at earlier world sizes (rank-independent, like the rest)
            state[S.SEGMENTS] = [list(seg) for seg in c.segments]
            state[S.HISTORY] = history_digest(self.fingerprint, int(c.epoch), c.segments)
        return state

    def load_state_dict(self, state: dict[str, Any], worker: int | None, num_workers: int) -> None:
        """Resume from a checked position (``pipeline/state.py`` checks a saved
        state first): ``state`` holds epoch, step, worker, num_workers, skipped
        and ``segments``, the elastic history this world resumes with.
        Loaded in DataLoader worker ``worker`` of ``num_workers`` (None, 0:
        the main process, whose resume every worker's next pass claims)."""
        epoch, step, segments = state[S.EPOCH], state[S.STEP], tuple(state[S.SEGMENTS])
        if state[S.WORKER] is not None:
            self._local_resume = {"epoch": epoch, "step": step, "limit": state[S.NUM_WORKERS], "segments": segments}
        elif worker is not None:  # a main-process state loaded inside a worker
            self._local_resume = {"epoch": epoch, "step": step + worker, "limit": num_workers, "segments": segments}
        else:
            self.history.set(epoch, segments)
            self.shared.set_resume(epoch, step)
        # A main-process total restored in workers goes to worker 0 alone, so it is counted once.
        mine = state[S.SKIPPED] if state[S.WORKER] is not None or worker is None or worker == 0 else 0
        self.shared.restore_skipped(SharedState.slot(worker), mine)
        self.cursor = None
