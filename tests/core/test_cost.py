"""The cost model object: formulas, the kernels' integer twin, validation."""

from __future__ import annotations

import pickle
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.core.cost import KINDS, CostModel, resolve_cost
from streambatch.planners.toolkit import batch_cost
from tests.support.helpers import examples

MODELS = [CostModel.linear(), CostModel.quadratic(), CostModel.quadratic_duration(1500),
          CostModel.quadratic_duration(1)]


def naive_cost(model: CostModel, count: int, max_len: int) -> Fraction:
    """The documented formulas, in exact Python arithmetic."""
    if model.kind == "linear":
        return count * max_len
    if model.kind == "quadratic":
        return count * max_len**2
    return count * (max_len + Fraction(max_len**2, model.q))


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(MODELS), st.integers(0, 4096), st.integers(0, 10**6))
def test_kernel_and_object_agree_with_the_formulas(model, count, max_len):
    scaled = int(model.scaled(count, max_len))
    assert scaled == batch_cost(*model.coefficients, count, max_len)  # the one kernel cost, every planner's
    assert scaled == naive_cost(model, count, max_len) * model.scale
    assert model.batch_cost(count, max_len) == pytest.approx(float(naive_cost(model, count, max_len)), rel=1e-12)


def test_vectorised_costs():
    model = CostModel.quadratic_duration(30)
    counts, lens = np.array([1, 2, 3]), np.array([10, 20, 30])
    assert model.scaled(counts, lens).tolist() == [10 * 40, 2 * 20 * 50, 3 * 30 * 60]
    assert model.scaled(counts, lens).dtype == np.int64
    assert model.batch_cost(counts, lens).tolist() == pytest.approx([10 + 100 / 30, 2 * (20 + 400 / 30), 3 * (30 + 30)])


def test_constructors_codes_and_scale():
    # the one encoding kernels take (a kind code was a second one: gone)
    assert [CostModel(k).coefficients for k in ("linear", "quadratic")] == [(0, 1), (1, 0)]
    assert CostModel.quadratic_duration(7).coefficients == (1, 7) and CostModel.quadratic_duration(7).scale == 7
    assert CostModel.quadratic().scale == CostModel.linear().scale == 1
    assert CostModel() == CostModel.quadratic()
    assert KINDS == ("linear", "quadratic", "quadratic_duration")
    assert str(CostModel.quadratic_duration(1500)) == "B*(L+L^2/1500)"
    assert CostModel.quadratic_duration(np.int32(9)).q == 9


def test_hashable_picklable_and_stable_repr():
    # planner options travel in configuration keys and checkpoints
    model = CostModel.quadratic_duration(1500)
    assert hash(model) == hash(CostModel.quadratic_duration(1500))
    assert pickle.loads(pickle.dumps(model)) == model
    assert repr(model) == "CostModel(kind='quadratic_duration', q=1500)"
    with pytest.raises(AttributeError):
        model.q = 3


@pytest.mark.parametrize("args, exc, words", [
    (("cubic",), ValueError, ["linear", "quadratic", "cubic"]),
    (("quadratic_duration", 0), ValueError, ["[1, 2**62]", "0"]),
    (("quadratic_duration", 2**63), ValueError, ["[1, 2**62]"]),
    (("quadratic_duration", 1.5), TypeError, ["integer", "frame_rate"]),
    (("quadratic_duration", True), TypeError, ["integer"]),
    (("quadratic", 5), ValueError, ["q only applies", "quadratic_duration"]),
])
def test_bad_models_are_refused_with_a_clear_message(args, exc, words):
    with pytest.raises(exc) as info:
        CostModel(*args)
    for word in words:
        assert word in str(info.value)


def test_resolve_cost():
    assert resolve_cost(None) == CostModel.quadratic()
    assert resolve_cost("linear") == CostModel.linear()
    model = CostModel.quadratic_duration(40)
    assert resolve_cost(model) is model
    with pytest.raises(ValueError, match="needs q"):
        resolve_cost("quadratic_duration")
    with pytest.raises(ValueError, match="one of"):
        resolve_cost("square")
    with pytest.raises(TypeError, match="CostModel"):
        resolve_cost(2)


def test_check_range_refuses_int64_overflow_and_names_the_fix():
    CostModel.quadratic().check_range(3000, 16_000, 64, 512)
    CostModel.linear().check_range(2**40, 2**41, 64, 64)
    with pytest.raises(ValueError, match="coarser units"):
        CostModel.quadratic_duration(2**60).check_range(3000, 16_000, 64, 8)
    with pytest.raises(ValueError, match="world_size=64"):
        CostModel.quadratic().check_range(2**28, 2**30, 64, 64)


def test_cost_cap_scales_max_step_cost_to_the_kernels_integer_cap():
    assert CostModel.quadratic().cost_cap(None) == np.iinfo(np.int64).max
    assert CostModel.quadratic().cost_cap(1000.7) == 1000
    assert CostModel.quadratic_duration(40).cost_cap(2.5) == 100  # kernels compare 40 * cost
    assert CostModel.linear().cost_cap(1e300) == np.iinfo(np.int64).max
    with pytest.raises(ValueError, match="below the cost of any batch"):
        CostModel.quadratic().cost_cap(0.5)
