"""One state round-trip check shared by every stateful iterable in the package.

``make()`` builds a fresh object with ``set_epoch``, ``__iter__``,
``state_dict`` and ``load_state_dict`` (the sampler, the streaming dataset).
The check interrupts a run at the start, middle and end of an epoch and in the
next epoch, restores into a fresh object, and requires the resumed run to equal
an uninterrupted one item for item: nothing lost, nothing repeated. The saved
state must also say where it was taken, under the package's named keys
(``streambatch.core.state``: EPOCH, STEP).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

from streambatch.core.state import EPOCH, STEP


def _run(obj: Any, epochs: range, key: Callable[[Any], Any]) -> list[list[Any]]:
    out = []
    for e in epochs:
        obj.set_epoch(e)
        out.append([key(x) for x in obj])
    return out


def check_state_roundtrip(make: Callable[[], Any], key: Callable[[Any], Any] = lambda x: x,
                          epochs: int = 2, cuts: tuple[float, ...] = (0.0, 0.5, 1.0),
                          epoch_key: str = EPOCH, step_key: str = STEP) -> None:
    """Assert that save/load at each cut of each epoch resumes exactly."""
    reference = _run(make(), range(epochs), key)
    for e in range(epochs):
        n = len(reference[e])
        for frac in cuts:
            k = int(round(frac * n))
            obj = make()
            obj.set_epoch(e)
            it = iter(obj)
            head = [key(next(it)) for _ in range(k)]
            # the state must survive serialisation, as in a checkpoint
            state = pickle.loads(pickle.dumps(copy.deepcopy(obj.state_dict())))
            assert (state[epoch_key], state[step_key]) == (e, k), f"state at item {k}/{n} of epoch {e}: {state}"
            fresh = make()
            fresh.load_state_dict(state)
            tail = [key(x) for x in fresh]
            assert head + tail == reference[e], f"resume at item {k}/{n} of epoch {e} diverged"
            later = _run(fresh, range(e + 1, epochs), key)
            assert later == reference[e + 1 :], f"epochs after a resume in epoch {e} diverged"
