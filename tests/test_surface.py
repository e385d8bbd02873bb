"""The user-facing surface reads as one library: the settings make_plan, DynamicBatchSampler and StreamingBatches
share have one name each, and the two classes take them in one order (the sampler's, seed-exact and positional)."""

from __future__ import annotations

import inspect

from streambatch import DynamicBatchSampler, StreamingBatches, make_plan

SHARED = ("max_batch_tokens", "max_batch_size", "shuffle", "drop_last", "rank", "world_size", "seed", "planner",
          "verify", "max_length", "long_samples")


def _order(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p in SHARED]


def test_the_classes_take_the_shared_settings_in_one_order():
    assert _order(DynamicBatchSampler) == _order(StreamingBatches) == list(SHARED)
    # the sampler's seed-exact positional order is unchanged
    params = list(inspect.signature(DynamicBatchSampler).parameters)
    assert params[:8] == ["lengths", "max_batch_tokens", "max_batch_size", "shuffle", "drop_last", "rank",
                          "world_size", "seed"]


def test_make_plan_uses_the_same_names():
    # make_plan keeps its positional order (world_size fourth, as every caller passes it); its names are the same
    names = set(inspect.signature(make_plan).parameters)
    assert {"max_batch_tokens", "max_batch_size", "shuffle", "drop_last", "world_size", "seed", "planner"} <= names
    assert list(inspect.signature(make_plan).parameters)[:4] == ["lengths", "max_batch_tokens", "max_batch_size",
                                                                 "world_size"]
