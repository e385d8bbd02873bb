"""Resuming a ``StreamingBatches``: a saved state checked against the
dataset before anything changes, and the elastic history this world
resumes with.

A state is any rank's ``state_dict()`` (they are equal) or, in the main
process, a torchdata ``StatefulDataLoader.state_dict()``
(``torch_glue/elastic.py`` finds the dataset's position in it). Every value
is bounded before any planning (``core/state.py``); the fingerprint must be
this dataset's at the saver's world size. Saved at another world size, the
saver's run becomes a finished segment of the epoch and the rest is planned
for this one (``epoch/sample_loop.py``, ``shard_loop.py``). The
checked position then goes to ``steps.Progress.load_state_dict``.

Stream: nothing: the checked position a state resumes at."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ...core import state as S
from ...core.config import check_epoch
from ...core.plan import config_fingerprint
from ...core.state import differences, max_world, read_state, state_int
from ...epoch.elastic import Segments, read_history, resize
from ...epoch.epoch_plan import EpochPlan
from ...torch_glue.distributed import active, agree
from ...torch_glue.elastic import dataset_state_from_loader, is_loader_state
from ..runtime.counters import MAX_WORKERS


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


def read_position(state: Any, plan: EpochPlan, info: Any) -> Position:
    """Check a ``StreamingBatches`` state against the dataset's epochs ``plan``
    (loaded in DataLoader worker ``info``, or the main process when None)
    before anything changes, every value bounded before any planning work
    (``core/state.py``); ValueError names what does not match."""
    s = read_state(state, "StreamingBatches", (S.EPOCH, S.STEP, S.WORKER, S.WORLD_SIZE, S.FINGERPRINT))
    n = int(plan.samples_per_epoch)  # every step trains at least one of them: the epoch has at most n steps
    worlds = max_world(n, plan.config.world_size)
    world = state_int(s, S.WORLD_SIZE, 1, worlds)
    # everything but the world size must match: compare at the saver's world size
    at_saver = plan.config_at(world)
    fingerprint = s[S.FINGERPRINT]
    if fingerprint != plan.fingerprint_at(world) and fingerprint != legacy_fingerprint(at_saver, plan.catalog):
        saved = dict(s.get(S.CONFIG) or {}, world_size=plan.config.world_size)
        what = differences(saved, plan.config.describe()) or (
            "the shard list or sidecars differ" if plan.sources is None else "the sources or their sidecars differ")
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
    if info is None and world == plan.config.world_size and step > plan.summary(epoch, segments).steps:
        # (a worker's own state is checked when its pass plans the epoch: no planning here; another
        # world's steps are checked when the rest of the epoch is planned from them)
        raise ValueError(f"state['step'] = {step} is beyond the {plan.summary(epoch, segments).steps} steps of "
                         f"epoch {epoch}; the state does not belong to this dataset")
    # a worker's state at the epoch's start holds its own first step (its id): none of the epoch trained yet
    trained = step if worker is None else max(0, step - num_workers + 1)
    S.warn_if_replanned(s, "StreamingBatches", plan.config.planner, epoch, trained)
    return Position(epoch, step, worker, num_workers, skipped, world, segments)


def legacy_fingerprint(config: Any, catalog: Any) -> str:
    """The version-1 streaming fingerprint (a hex string), so old states still load."""
    c = config
    key = (c.max_batch_tokens, c.max_batch_size, c.world_size, c.window_samples, c.shuffle, c.drop_last, c.seed,
           c.planner, repr(c.planner_options))
    key += c.mode_tag  # the read mode's part of a key (nothing for "sample")
    h = hashlib.blake2b(digest_size=8)
    h.update((catalog.fingerprint() + repr(key)).encode())
    return h.hexdigest()


def resume(state: Any, plan: EpochPlan, have: Callable[[int], Segments], info: Any, verify: bool,
           fingerprint: int) -> dict[str, Any]:
    """The position ``state`` resumes at, checked, in the keys
    ``steps.Progress.load_state_dict`` takes (``segments``: the elastic
    history this world resumes with). Loaded in DataLoader worker ``info``
    (None: the main process, where with ``verify`` under torch.distributed
    every rank checks that all resume alike, and all raise if any failed).
    have(epoch) -> the history the main process already set for ``epoch``."""
    failure: BaseException | None = None
    pos, segments = None, ()
    try:
        pos, segments = check_resume(state, plan, have, info)
    except Exception as exc:
        failure = exc
    if info is None and verify and active(plan.config.world_size):
        agree({"fingerprint": fingerprint, "epoch": pos.epoch if pos else 0, "step": pos.step if pos else 0,
               "elastic history": segments_key(segments)},
              "the resumed position" + (f" (epoch {pos.epoch}, step {pos.step})" if pos else ""), failure)
    elif failure is not None:
        raise failure
    pos = cast(Position, pos)  # agree() raised on every rank if any failed to read the state
    return {S.EPOCH: pos.epoch, S.STEP: pos.step, S.WORKER: pos.worker, S.NUM_WORKERS: pos.num_workers,
            S.SKIPPED: pos.skipped, S.SEGMENTS: segments}


def check_resume(state: Any, plan: EpochPlan, have: Callable[[int], Segments], info: Any
                 ) -> tuple[Position, Segments]:
    """(the checked position, the elastic history this world resumes with) of
    ``state`` loaded in DataLoader worker ``info`` (None: the main process).
    have(epoch) -> the history the main process already set for ``epoch``
    (a worker checks a main-process elastic resume against it)."""
    if info is None and is_loader_state(state):
        state = dataset_state_from_loader(state)
    pos = read_position(state, plan, info)
    world = plan.config.world_size
    done = sum(k for _, k in pos.segments)
    # from another world size: the saver's run becomes a finished segment of the epoch
    segments = resize(pos.segments, pos.world_size, pos.step, done, world)
    if info is None and pos.world_size != world:
        plan.summary(pos.epoch, segments)  # plans the rest now: a history that does not fit raises here
    elif info is not None and pos.world_size != world:
        nxt = pos.step + (info.id if pos.worker is None else 0)
        segments = _prepared(have(pos.epoch), pos.segments, pos.world_size, world, nxt, info.num_workers)
    return pos, segments


def _prepared(have: Segments, segments: Segments, saved_world: int, world: int, nxt: int, workers: int) -> Segments:
    """In a worker: the history of an elastic resume that the main process
    loaded (``have``), checked against this worker's own saved next step ``nxt``."""
    n = len(segments)
    fits = have[:n] == segments and (len(have) == n or (len(have) == n + 1 and have[n][0] == saved_world))
    if not fits or not nxt - workers < sum(k for _, k in have) <= nxt:
        raise ValueError(
            f"this DataLoader worker got a state saved at world_size={saved_world} (this run: "
            f"{world}); only the loader knows where that world stopped, so load the loader's whole "
            "state into the dataset in the main process first: ds.load_state_dict(loader_state), then "
            "iterate the loader (restoring loader_state into it too is optional)"
        )
    return have


def segments_key(segments: Segments) -> int:
    """A 63-bit hash of an elastic history (0 for none), for the cross-rank check."""
    if not segments:
        return 0
    return config_fingerprint(np.array([x for seg in segments for x in seg], dtype=np.int64))


# The order of a saved state's keys, as the dataset has always written them.
STATE_KEYS = (S.VERSION, S.EPOCH, S.STEP, S.WORKER, S.NUM_WORKERS, S.WORLD_SIZE, S.SEED, S.FINGERPRINT, S.CONFIG,
              S.SKIPPED, S.SEGMENTS, S.HISTORY, S.SOURCES, S.PLANS)


def ordered_state(position: dict[str, Any], world_size: int, config: Any, fingerprint: int,
                  sources: list[tuple[int, int]] | None) -> dict[str, Any]:
    """A dataset's state: its position (``steps.Progress.state_dict``) nested
    with what it was planned for: world size, seed, fingerprint, settings by
    name (``config.describe()``) and, for a mix, each source's (cycle,
    position) at the epoch's start. Keys in the ``core/state.py`` format."""
    state = {S.VERSION: S.STATE_VERSION, S.WORLD_SIZE: world_size, S.SEED: config.seed, S.FINGERPRINT: fingerprint,
             S.CONFIG: config.describe(), S.PLANS: S.PLAN_GENERATION, **position}
    if sources is not None:
        state[S.SOURCES] = [list(p) for p in sources]
    return {k: state[k] for k in STATE_KEYS if k in state}
