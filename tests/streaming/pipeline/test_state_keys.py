"""A streaming state missing a key it needs is a ValueError naming the key (issue 32, item 20: a state with
``worker`` but no ``num_workers`` raised a bare KeyError)."""

from __future__ import annotations

import pytest

from streambatch.core.state import state_int
from streambatch.streaming import StreamingBatches


def test_state_int_names_a_missing_key():
    with pytest.raises(ValueError, match=r"the state has no 'num_workers'"):
        state_int({"worker": 0}, "num_workers", 1, 8)


def test_a_worker_state_without_num_workers_names_the_key(make_corpus):
    ds = StreamingBatches(make_corpus([12, 9], seed=2).paths, 400, 8, window_samples=10)
    state = ds.state_dict()
    state["worker"] = 0  # as a worker saves it, but the worker count lost (hand-edited, or a partial copy)
    state.pop("num_workers")
    with pytest.raises(ValueError, match=r"num_workers") as info:
        ds.load_state_dict(state)
    assert not isinstance(info.value, KeyError)
