"""A state saved mid-epoch by a streambatch that planned that epoch differently resumes it under this one's plan:
some of its samples trained twice, others not at all. Loading one warns (``PlanChangedWarning``, ``core/state.py``);
a state of this generation, one saved at an epoch's start, and the seed-exact greedy planner's load silently."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from streambatch import DynamicBatchSampler, PlanChangedWarning
from streambatch.core.state import PLAN_GENERATION, PLANS
from streambatch.streaming import StreamingBatches
from tests.support.corpus import index_corpus
from tests.support.shards import write_corpus


def lengths() -> np.ndarray:
    return np.random.default_rng(0).integers(10, 400, 600)


def sampler_state(planner: str, steps: int) -> dict:
    s = DynamicBatchSampler(lengths(), 2000, 16, rank=0, world_size=2, planner=planner)
    s.set_epoch(1)
    it = iter(s)
    for _ in range(steps):
        next(it)
    return s.state_dict()


def load_sampler(state: dict, planner: str) -> list[warnings.WarningMessage]:
    s = DynamicBatchSampler(lengths(), 2000, 16, rank=0, world_size=2, planner=planner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s.load_state_dict(state)
    return [w for w in caught if issubclass(w.category, PlanChangedWarning)]


def older(state: dict, generation: int | None = None) -> dict:
    """``state`` as a streambatch of another plan generation saved it (None: before generations were recorded)."""
    out = {k: v for k, v in state.items() if k != PLANS}
    if generation is not None:
        out[PLANS] = generation
    return out


def test_sampler_state_records_the_generation_and_loads_silently():
    state = sampler_state("bucketed", 3)
    assert state[PLANS] == PLAN_GENERATION
    assert load_sampler(state, "bucketed") == []


@pytest.mark.parametrize("generation", [None, 0, PLAN_GENERATION + 1])
def test_sampler_state_of_another_generation_warns(generation):
    found = load_sampler(older(sampler_state("bucketed", 3), generation), "bucketed")
    assert len(found) == 1
    message = str(found[0].message)
    assert "3 step(s) into epoch 1" in message and "finish it with the streambatch that saved" in message
    assert "planner='bucketed'" in message


def test_epoch_start_and_greedy_states_load_silently():
    # nothing of the epoch trained yet: every generation resumes it alike
    assert load_sampler(older(sampler_state("bucketed", 0)), "bucketed") == []
    # the seed-exact planner plans the seed's batches in every generation
    assert load_sampler(older(sampler_state("greedy", 3)), "greedy") == []


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    brace, _, _ = write_corpus(tmp_path_factory.mktemp("generation"), [30, 25, 35, 28], seed=3, prefix="gen")
    index_corpus(brace)
    return brace


def streaming_state(corpus: str, steps: int) -> dict:
    ds = StreamingBatches(corpus, 400, 6, rank=0, world_size=2, read_mode="sample", planner="bucketed")
    for i, _ in enumerate(ds):
        if i + 1 == steps:
            break
    return ds.state_dict()


def load_streaming(corpus: str, state: dict) -> list[warnings.WarningMessage]:
    ds = StreamingBatches(corpus, 400, 6, rank=1, world_size=2, read_mode="sample", planner="bucketed")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds.load_state_dict(state)
    return [w for w in caught if issubclass(w.category, PlanChangedWarning)]


def test_streaming_state_of_another_generation_warns(corpus):
    state = streaming_state(corpus, 2)
    assert state[PLANS] == PLAN_GENERATION and state["step"] == 2
    assert load_streaming(corpus, state) == []
    found = load_streaming(corpus, older(state))
    assert len(found) == 1 and "StreamingBatches: this state was saved 2 step(s) into epoch 0" in str(found[0].message)
