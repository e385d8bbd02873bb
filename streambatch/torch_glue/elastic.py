"""Glue for elastic resume: the segment history in shared memory, and reading
where a torchdata ``StatefulDataLoader`` stopped.

The planning itself is the plan layer's ``epoch/elastic.py`` (map-style) and
``epoch/sample_loop.py`` (windows); this module only moves a few integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from multiprocessing.sharedctypes import RawArray
from typing import Any

from ..core.state import MAX_SEGMENTS, state_int  # MAX_SEGMENTS: resizes one epoch records (two ints each)
from ..epoch.elastic import Segments


class SharedSegments:
    """An epoch's elastic history in shared memory, so that ``load_state_dict``
    in the main process reaches DataLoader workers (persistent ones too).

    Layout: [epoch it applies to (-1: none), n, w0, k0, w1, k1, ...].
    """

    def __init__(self) -> None:
        self._a = RawArray("q", 2 + 2 * MAX_SEGMENTS)
        self._a[0] = -1

    def get(self, epoch: int) -> Segments:
        """The history of ``epoch`` (empty unless one was set for it)."""
        if self._a[0] != epoch:
            return ()
        n = int(self._a[1])
        return tuple((int(self._a[2 + 2 * i]), int(self._a[3 + 2 * i])) for i in range(n))

    def set(self, epoch: int, segments: Segments) -> None:
        if len(segments) > MAX_SEGMENTS:
            raise ValueError(f"an epoch can be resumed on another world size at most {MAX_SEGMENTS} times, "
                             f"this state has {len(segments)} resizes; start the next epoch instead")
        self._a[0] = -1  # readers see no history while it is rewritten
        self._a[1] = len(segments)
        for i, (w, k) in enumerate(segments):
            self._a[2 + 2 * i], self._a[3 + 2 * i] = w, k
        self._a[0] = epoch if segments else -1

    def __getstate__(self) -> dict[str, Any]:
        import multiprocessing.context

        if multiprocessing.context.get_spawning_popen() is not None:
            return {"a": self._a}  # to a spawned worker: the same shared memory
        return {"values": list(self._a)}  # checkpoints, deepcopy: the values

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "a" in state:
            self._a = state["a"]
        else:
            self._a = RawArray("q", state["values"])


def is_loader_state(state: Any) -> bool:
    """True for a torchdata ``StatefulDataLoader.state_dict()`` (single- or
    multi-process) rather than a dataset's own state."""
    return isinstance(state, Mapping) and ("_snapshot" in state or "_num_yielded" in state)


def dataset_state_from_loader(state: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset state of the main process equivalent to a StatefulDataLoader
    state: the position after the batches the loader had yielded.

    With workers, each worker's snapshot holds only its own next step, so no
    single worker knows where the rank stopped; the loader's yielded count
    (snapshot step + steps since) does, and the workers' states must agree
    with it: their next steps are the ``num_workers`` steps from there on.
    """
    if "_snapshot" not in state:  # num_workers=0: the dataset's own state
        inner = state.get("dataset_state")
        if not isinstance(inner, Mapping):
            raise ValueError("this StatefulDataLoader state holds no dataset state; was it saved from a loader "
                             "over this dataset?")
        return dict(inner)
    snap = state["_snapshot"]
    workers = snap.get("_worker_snapshots", {})
    states = [workers.get(f"worker_{i}", {}).get("dataset_state") for i in range(len(workers))]
    if not states or any(not isinstance(s, Mapping) for s in states):
        raise ValueError("this StatefulDataLoader state holds no dataset state for some worker; was it saved "
                         "from a loader over this dataset?")
    yielded = int(snap["_snapshot_step"]) + int(state.get("_steps_since_snapshot", 0))
    first = dict(states[0])
    keys = ("epoch", "world_size", "fingerprint", "segments")
    for s in states[1:]:
        if any(s.get(k) != first.get(k) for k in keys):
            raise ValueError("the workers' states in this StatefulDataLoader state disagree on epoch, world size, "
                             "data or segments; it was not saved by one loader over this dataset")
    # A worker that has not delivered a batch yet still holds its start-up
    # state, a main-process position (worker None): its next step is that + its id.
    # (each worker's counters are checked as ints here; their bounds when the combined state is read)
    nxt = sorted(state_int(s, "step") + (i if s.get("worker") is None else 0) for i, s in enumerate(states))
    if not state.get("_iterator_finished", False) and nxt[0] != int(snap["_snapshot_step"]):
        raise ValueError(f"the workers' next steps {nxt} do not start at the loader's snapshot step "
                         f"{snap['_snapshot_step']}; this state was not saved by a StatefulDataLoader over this "
                         "dataset with in_order=True")
    skipped = sum(state_int(s, "skipped") if "skipped" in s else 0 for s in states)
    first.update(step=yielded, worker=None, num_workers=0, skipped=skipped)
    return first
