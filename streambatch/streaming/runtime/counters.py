"""Where a ``StreamingBatches`` pass starts: the counters it shares with its
DataLoader workers, and the reading of saved states.

``set_epoch``, ``set_start_batch`` and a main-process ``load_state_dict``
happen in the main process while persistent DataLoader workers hold copies
of the dataset, and samples skipped in workers must be counted where the
user looks. So these few integers live in shared memory (``RawArray``: it
travels to forked and spawned workers alike), and each process writes only
its own slots, so no lock is needed.

Layout (int64): epoch; a pending resume (epoch or -1, step, a token that
changes with each new resume, and the worker count of the pass that claimed
it); skips loaded from a state; then one "claimed token" slot per worker and
one skip counter per process (main process, worker 0, worker 1, ...).

Stream: nothing: shared-memory counters (epoch, resume position, skips) across a rank's processes."""

from __future__ import annotations

import hashlib
import multiprocessing.context
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray
from typing import Any

from ...core import state as S
from ...core.config import check_epoch
from ...core.state import differences, max_world, read_state, state_int

MAX_WORKERS = 256  # DataLoader workers per rank that can share one dataset

_EPOCH, _R_EPOCH, _R_STEP, _R_TOKEN, _R_WORKERS, _SKIP_BASE = range(6)
_CLAIMS = 6                     # + worker id: the resume token this worker last claimed
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
        if self._a[_R_EPOCH] != epoch:
            self._a[_R_EPOCH] = -1  # a resume belongs to its epoch

    # ------------------------------------------------------------ resume

    def set_resume(self, epoch: int, step: int) -> None:
        """The next pass over ``epoch`` starts at ``step`` (once: see ``claim``)."""
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


# ---------------------------------------------------------------- saved states


@dataclass(frozen=True)
class Position:
    """A checked saved position: ``worker`` None for a main-process state;
    ``world_size`` the saver's, ``segments`` its epoch's elastic history."""

    epoch: int
    step: int
    worker: int | None
    num_workers: int
    skipped: int
    world_size: int = 0
    segments: tuple = ()


def read_position(state: Any, ds: Any, info: Any) -> Position:
    """Check a ``StreamingBatches`` state against dataset ``ds`` (loaded in
    DataLoader worker ``info``, or the main process when None) before
    anything changes, every value bounded before any planning work
    (``core/state.py``); ValueError names what does not match."""
    from ...planners.elastic import read_history

    s = read_state(state, "StreamingBatches", (S.EPOCH, S.STEP, S.WORKER, S.WORLD_SIZE, S.FINGERPRINT))
    n = int(ds.samples_per_epoch)  # every step trains at least one of them: the epoch has at most n steps
    worlds = max_world(n, ds.world_size)
    world = state_int(s, S.WORLD_SIZE, 1, worlds)
    # everything but the world size must match: compare at the saver's world size
    at_saver = ds.config_at(world)
    if s[S.FINGERPRINT] != ds.fingerprint_at(world) and s[S.FINGERPRINT] != legacy_fingerprint(at_saver, ds.catalog):
        saved = dict(s.get(S.CONFIG) or {}, world_size=ds.world_size)
        what = differences(saved, ds.config.describe()) or ("the shard list or sidecars differ" if ds.sources is None
                                                             else "the sources or their sidecars differ")
        raise ValueError(f"state was saved for other shards, sidecars or settings ({what}); resume with the same "
                         "shard list, sidecars, max_batch_tokens, max_batch_size, window_samples, read_mode, shuffle, "
                         "drop_last, seed and planner")
    epoch = check_epoch(state_int(s, S.EPOCH, 0, S.MAX_EPOCH), "state['epoch']")
    worker, num_workers = s[S.WORKER], 0
    if worker is not None:
        num_workers = state_int(s, S.NUM_WORKERS, 1, MAX_WORKERS, f" (DataLoader workers per rank, at most "
                                                                  f"{MAX_WORKERS})")
        worker = state_int(s, S.WORKER, 0, num_workers - 1, f" (a worker id of state['num_workers'] = {num_workers})")
        if info is None or (info.id, info.num_workers) != (worker, num_workers):
            here = "the main process" if info is None else f"worker {info.id} of {info.num_workers}"
            raise ValueError(f"state was saved by DataLoader worker {worker} of {num_workers} and is being loaded in "
                             f"{here}; restore it through a StatefulDataLoader with num_workers={num_workers}, or "
                             "save the main process's state instead")
    elif S.NUM_WORKERS in s:
        state_int(s, S.NUM_WORKERS, 0, MAX_WORKERS)  # a main-process state's (0), unused but bounded like the rest
    segments = read_history(s, epoch, n, worlds)
    # a worker's state holds its own next step, up to its worker count past the epoch's last
    limit = n + num_workers
    step = state_int(s, S.STEP, 0, limit, f": beyond the {limit} steps of epoch {epoch} at most (one or more of "
                                          f"its {n} samples each" + (f", plus {num_workers} workers" if worker is not
                                                                     None else "") + ")")
    done = sum(k for _, k in segments)
    if step < done:
        raise ValueError(f"state['step'] = {step} is below the {done} steps of state['segments']; {S.DAMAGED}")
    skipped = state_int(s, S.SKIPPED, 0, S.MAX_COUNT, " (samples skipped so far)") if S.SKIPPED in s else 0
    if info is None and world == ds.world_size and step > ds._summary(epoch, segments).steps:
        # (a worker's own state is checked when its pass plans the epoch: no planning here; another
        # world's steps are checked when the rest of the epoch is planned from them)
        raise ValueError(f"state['step'] = {step} is beyond the {ds._summary(epoch, segments).steps} steps of "
                         f"epoch {epoch}; the state does not belong to this dataset")
    return Position(epoch, step, worker, num_workers, skipped, world, segments)


def legacy_fingerprint(config: Any, catalog: Any) -> str:
    """The version-1 streaming fingerprint (a hex string), so old states still load."""
    c = config
    key = (c.max_batch_tokens, c.max_batch_size, c.world_size, c.window_samples, c.shuffle, c.drop_last, c.seed,
           c.planner, repr(c.planner_options))
    if c.read_mode != "sample":
        key += (c.read_mode,)
    h = hashlib.blake2b(digest_size=8)
    h.update((catalog.fingerprint() + repr(key)).encode())
    return h.hexdigest()
