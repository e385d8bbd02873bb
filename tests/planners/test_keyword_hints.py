"""A misspelled keyword names the keyword meant (issue 32, item 17). The entry points pass unknown keywords
to the planner as options, so ``world_sise=2`` used to read "planner 'greedy' got unknown option(s)",
``batch_size=8`` suggested nothing, and ``max_batch_token=`` reported a missing positional argument."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from streambatch import DynamicBatchSampler, StreamingBatches, make_plan
from streambatch.core.config import PlanConfig
from streambatch.core.keywords import ENTRY_KEYWORDS
from streambatch.planners import UnknownOptionError

LENGTHS = np.arange(1, 60)


def sampler(**kw):
    return DynamicBatchSampler(LENGTHS, **kw)


def plan(**kw):
    return make_plan(LENGTHS, **kw)


def streaming(tmp_path):
    def build(**kw):
        return StreamingBatches(str(tmp_path / "train-{000000..000001}.tar"), **kw)
    return build


@pytest.mark.parametrize("entry", ["sampler", "plan", "streaming"])
@pytest.mark.parametrize("kwargs, meant", [
    ({"max_batch_tokens": 100, "world_sise": 2}, "world_size"),
    ({"max_batch_tokens": 100, "batch_size": 8}, "max_batch_size"),
    ({"max_batch_tokens": 100, "num_replicas": 2}, "world_size"),
    ({"max_batch_tokens": 100, "drop_lst": True}, "drop_last"),
    ({"max_batch_token": 100}, "max_batch_tokens"),
    ({"max_tokens": 100}, "max_batch_tokens"),
])
def test_a_misspelled_keyword_names_the_one_meant(tmp_path, entry, kwargs, meant):
    build = {"sampler": sampler, "plan": plan, "streaming": streaming(tmp_path)}[entry]
    with pytest.raises(TypeError, match=rf"did you mean {meant}=") as info:
        build(**kwargs)
    wrong = next(k for k in kwargs if k != "max_batch_tokens")
    assert repr(wrong) in str(info.value)
    assert "missing 1 required positional argument" not in str(info.value)


def test_a_misspelled_planner_option_names_the_option():
    with pytest.raises(UnknownOptionError, match=r"'bucket_widht'.*did you mean bucket_width="):
        make_plan(LENGTHS, 100, planner="bucketed", bucket_widht=0.1)
    with pytest.raises(UnknownOptionError, match=r"'pack'.*packed batches are planner='bucketed', pack=True"):
        make_plan(LENGTHS, 100, pack=True)  # the existing hint stays


def test_an_unrelated_unknown_option_lists_the_options_without_guessing():
    with pytest.raises(UnknownOptionError, match=r"'zebra'.*its options are") as info:
        make_plan(LENGTHS, 100, planner="bucketed", zebra=1)
    assert "did you mean" not in str(info.value)


def test_max_batch_tokens_is_still_required():
    for call in (lambda: DynamicBatchSampler(LENGTHS), lambda: make_plan(LENGTHS)):
        with pytest.raises(TypeError, match=r"max_batch_tokens is required"):
            call()
    assert len(DynamicBatchSampler(LENGTHS, 100)) > 0  # positional, as in the seed sampler


def test_plan_config_build_names_a_misspelled_setting():
    with pytest.raises(TypeError, match=r"'world_sise'.*did you mean world_size="):
        PlanConfig.build(100, world_sise=2)


def test_entry_keywords_cover_every_entry_point():
    for fn in (make_plan, DynamicBatchSampler.__init__, StreamingBatches.__init__, PlanConfig.build):
        names = {p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in ("self", "cls")}
        assert names <= set(ENTRY_KEYWORDS), (fn, sorted(names - set(ENTRY_KEYWORDS)))
