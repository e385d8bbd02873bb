"""Where a ``StreamingBatches`` pass starts: the counters it shares with its
DataLoader workers (``pipeline/steps.Progress`` reads and writes them).

``set_epoch``, ``set_start_batch`` and a main-process ``load_state_dict``
happen in the main process while persistent DataLoader workers hold copies
of the dataset, and samples skipped in workers must be counted where the
user looks. So these few integers live in shared memory (``RawArray``: it
travels to forked and spawned workers alike), and each process writes only
its own slots, so no lock is needed.

Layout (int64): epoch; a pending resume (epoch or -1, step, a token that
changes with each new resume, and the worker count of the pass that claimed
it); skips loaded from a state; the epoch (+ 1) of a pass DataLoader workers
began since the main process last set a position (0: none; then only the
workers know how far the pass got); then one "claimed token" slot per worker
and one skip counter per process (main process, worker 0, worker 1, ...).

Stream: nothing: shared-memory counters (epoch, resume position, skips) across a rank's processes."""

from __future__ import annotations

import multiprocessing.context
from multiprocessing.sharedctypes import RawArray
from typing import Any

MAX_WORKERS = 256  # DataLoader workers per rank that can share one dataset

_EPOCH, _R_EPOCH, _R_STEP, _R_TOKEN, _R_WORKERS, _SKIP_BASE, _W_PASS = range(7)
_CLAIMS = 7                     # + worker id: the resume token this worker last claimed
_SKIPS = _CLAIMS + MAX_WORKERS  # + 0 (main process) or 1 + worker id: samples it skipped
_SIZE = _SKIPS + 1 + MAX_WORKERS


class SharedState:
    """Epoch, pending resume and skip counters, shared with DataLoader workers."""

    def __init__(self) -> None:
        self._a = RawArray("q", _SIZE)
        self._a[_R_EPOCH] = -1

    # ------------------------------------------------------------ epoch

    @property
    def epoch(self) -> int:
        return int(self._a[_EPOCH])

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._a[_EPOCH] = epoch
        self._a[_W_PASS] = 0  # a new pass: it starts where the main process says
        if self._a[_R_EPOCH] != epoch:
            self._a[_R_EPOCH] = -1  # a resume belongs to its epoch

    # ------------------------------------------------------------ who holds the position

    def pass_began(self, epoch: int, worker: int | None) -> None:
        """A pass over ``epoch`` begins in a DataLoader worker (its position is then the workers'), or in the
        main process (``worker`` None: the main process knows its own)."""
        self._a[_W_PASS] = 0 if worker is None else epoch + 1

    def workers_hold(self, epoch: int) -> bool:
        """Did DataLoader workers begin a pass over ``epoch`` after the main process last set a position?"""
        return self._a[_W_PASS] == epoch + 1

    # ------------------------------------------------------------ resume

    def set_resume(self, epoch: int, step: int) -> None:
        """The next pass over ``epoch`` starts at ``step`` (once: see ``claim``)."""
        self._a[_W_PASS] = 0
        self._a[_EPOCH] = epoch
        self._a[_R_STEP] = step
        self._a[_R_WORKERS] = 0
        self._a[_R_TOKEN] += 1
        self._a[_R_EPOCH] = epoch

    def pending(self, epoch: int) -> int | None:
        """The resume step of ``epoch`` no process has started from yet, else None."""
        if self._a[_R_EPOCH] == epoch and self._a[_R_WORKERS] == 0:
            return int(self._a[_R_STEP])
        return None

    def claim(self, epoch: int, worker: int | None, num_workers: int) -> int | None:
        """The resume step for the pass this process is starting, or None.

        The main process (``worker=None``) consumes the resume. Worker ``w``
        of ``N`` takes it once per resume: every worker of the first pass
        after ``set_start_batch`` starts from it, later passes (persistent
        workers, or new ones) start from the epoch's beginning again. A pass
        with another worker count than the claiming one ignores it.
        """
        a = self._a
        if a[_R_EPOCH] != epoch:
            return None
        if worker is None:
            a[_R_EPOCH] = -1
            return int(a[_R_STEP])
        if worker >= MAX_WORKERS:
            raise ValueError(f"StreamingBatches supports at most {MAX_WORKERS} DataLoader workers per rank, "
                             f"got worker {worker} of {num_workers}")
        token = a[_R_TOKEN]
        if a[_CLAIMS + worker] == token or a[_R_WORKERS] not in (0, num_workers):
            return None
        a[_R_WORKERS] = num_workers
        a[_CLAIMS + worker] = token
        return int(a[_R_STEP])

    # ------------------------------------------------------------ skips

    @staticmethod
    def slot(worker: int | None) -> int:
        return 0 if worker is None else 1 + min(worker, MAX_WORKERS - 1)

    def add_skip(self, slot: int) -> None:
        self._a[_SKIPS + slot] += 1

    def skipped(self, slot: int | None = None) -> int:
        """Samples skipped by one process (``slot``), or by all of them plus
        those restored from a state (``None``)."""
        if slot is not None:
            return int(self._a[_SKIPS + slot])
        return int(self._a[_SKIP_BASE]) + sum(self._a[_SKIPS:_SIZE])

    def restore_skipped(self, slot: int, count: int) -> None:
        """Continue a saved count: the main process's total, or one worker's own."""
        if slot == 0:
            self._a[_SKIP_BASE] = count
            for i in range(_SKIPS, _SIZE):
                self._a[i] = 0
        else:
            self._a[_SKIPS + slot] = count

    # ------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        if multiprocessing.context.get_spawning_popen() is None:
            # Plain pickling (checkpoints, deepcopy): shared memory cannot travel, values can.
            return {"values": list(self._a)}
        return {"array": self._a}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._a = state["array"] if "array" in state else RawArray("q", state["values"])
