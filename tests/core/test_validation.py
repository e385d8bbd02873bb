"""Bad input to ``make_plan`` fails fast with a ValueError/TypeError naming it.

Never a Numba error, never a hang, never a silently wrong plan. Each
``match`` pins the offending value in the message, so these tests fail if a
message stops naming it.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from streambatch import Plan, make_plan
from tests.support.helpers import examples

pytestmark = pytest.mark.timeout(60)

OK = [3, 1, 4, 1, 5]


def esc(value) -> str:
    return re.escape(str(value))


# (lengths, error type, pattern that must appear in the message)
BAD_LENGTHS = [
    ([3, -1, 4], ValueError, r"lengths\[1\].*-1"),
    (np.array([3, 1, -7], dtype=np.int32), ValueError, r"lengths\[2\].*-7"),
    (np.array([3.0, -2.0]), ValueError, r"lengths\[1\].*-2"),
    ([3.0, float("nan"), 1.0], ValueError, r"lengths\[1\].*nan"),
    ([3.0, 1.0, float("inf")], ValueError, r"lengths\[2\].*inf"),
    ([3.0, -math.inf], ValueError, r"lengths\[1\].*inf"),
    ([3.0, 1.5], ValueError, r"lengths\[1\].*1\.5"),
    (np.array([2.0, 2.25], dtype=np.float32), ValueError, r"lengths\[1\].*2\.25"),
    (torch.tensor([1.0, 0.5]), ValueError, r"lengths\[1\].*0\.5"),
    (torch.tensor([4, -9]), ValueError, r"lengths\[1\].*-9"),
    ([1.0, 2.0**63], ValueError, r"lengths\[1\]"),
    (np.array([1, 2**64 - 1], dtype=np.uint64), ValueError, r"lengths\[1\].*18446744073709551615"),
    ([[1, 2], [3, 4]], ValueError, r"1-D.*\(2, 2\)"),
    (np.zeros((3, 1)), ValueError, r"1-D.*\(3, 1\)"),
    (5, ValueError, r"1-D.*\(\)"),
    (np.int64(5), ValueError, r"1-D.*\(\)"),
    ([[1, 2], [3]], ValueError, r"lengths"),  # ragged
    ("1 2 3", TypeError, r"str"),
    (b"123", TypeError, r"bytes"),
    ([True, False], TypeError, r"bool"),
    ([1 + 2j], TypeError, r"complex"),
]


@pytest.mark.parametrize("lengths, exc, pattern", BAD_LENGTHS, ids=[repr(b[0])[:40] for b in BAD_LENGTHS])
def test_bad_lengths(lengths, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make_plan(lengths, 100)


# Non-numeric elements: the message must point at the offending element, as it
# does for a negative or NaN length, not only at the dtype numpy inferred.
NON_NUMERIC = [
    ([3, None, 4], r"lengths\[1\].*None"),
    ([3, 4, "x"], r"lengths\[2\].*'?x'?"),
    ([3, object()], r"lengths\[1\].*object"),
    ([3, 2**70], r"lengths\[1\].*" + esc(2**70)),
]


@pytest.mark.parametrize("lengths, pattern", NON_NUMERIC, ids=["None", "str", "object", "2**70"])
def test_non_numeric_elements_are_named(lengths, pattern):
    with pytest.raises((TypeError, ValueError), match=pattern):
        make_plan(lengths, 100)


def test_none_lengths_is_named():
    with pytest.raises((TypeError, ValueError), match="None"):
        make_plan(None, 100)


@pytest.mark.parametrize("world_size, lmax", [(1, 3 * 10**9), (64, 10**8), (1024, 2**25)])
def test_costs_beyond_int64_are_refused(world_size, lmax):
    # enough samples that the size cap of 64 is not clamped to N
    lengths = [1, lmax, 2] * 30
    with pytest.raises(ValueError, match=esc(lmax) + ".*" + f"world_size={world_size}"):
        make_plan(lengths, 2**40, max_batch_size=64, world_size=world_size)


def test_huge_integer_length_is_refused():
    with pytest.raises(ValueError, match=esc(2**63 - 1)):
        make_plan(np.array([1, 2**63 - 1], dtype=np.int64), 100)


@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        (0, ValueError, r"max_batch_tokens.*\b0\b"),
        (-5, ValueError, r"max_batch_tokens.*-5"),
        (-2.5, ValueError, r"max_batch_tokens.*-2\.5"),
        (float("nan"), ValueError, r"max_batch_tokens.*nan"),
        (float("inf"), ValueError, r"max_batch_tokens.*inf"),
        ("100", TypeError, r"max_batch_tokens.*'100'"),
        (None, TypeError, r"max_batch_tokens.*None"),
        (True, TypeError, r"max_batch_tokens.*True"),
        ([100], TypeError, r"max_batch_tokens.*\[100\]"),
    ],
    ids=["0", "-5", "-2.5", "nan", "inf", "str", "None", "bool", "list"],
)
def test_bad_max_batch_tokens(value, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make_plan(OK, value)


@pytest.mark.parametrize("name", ["max_batch_size", "world_size"])
@pytest.mark.parametrize(
    "value, exc, pattern",
    [
        (0, ValueError, r"\b0\b"),
        (-3, ValueError, r"-3"),
        (4.0, TypeError, r"4\.0"),
        (float("nan"), TypeError, r"nan"),
        ("4", TypeError, r"'4'"),
        (None, TypeError, r"None"),
        (True, TypeError, r"True"),
        (np.bool_(True), TypeError, r"True"),
    ],
    ids=["0", "-3", "float", "nan", "str", "None", "bool", "np.bool_"],
)
def test_bad_counts(name, value, exc, pattern):
    with pytest.raises(exc, match=f"{name}.*{pattern}"):
        make_plan(OK, 100, **{name: value})


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(seed=1.5), TypeError, r"seed.*1\.5"),
        (dict(seed="42"), TypeError, r"seed.*'42'"),
        (dict(seed=None), TypeError, r"seed.*None"),
        (dict(seed=False), TypeError, r"seed.*False"),
        (dict(epoch=-1), ValueError, r"epoch.*-1"),
        (dict(epoch=1.0), TypeError, r"epoch.*1\.0"),
        (dict(epoch=True), TypeError, r"epoch.*True"),
        (dict(planner="gredy"), ValueError, r"'gredy'.*|.*greedy.*'gredy'"),
        (dict(planner=None), ValueError, r"None"),
        (dict(planner=3), ValueError, r"\b3\b"),
    ],
    ids=["seed-float", "seed-str", "seed-None", "seed-bool", "epoch-neg", "epoch-float", "epoch-bool",
         "planner-typo", "planner-None", "planner-int"],
)
def test_bad_other_arguments(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make_plan(OK, 100, **kwargs)


def test_unknown_planner_lists_the_choices():
    with pytest.raises(ValueError, match=r"greedy") as info:
        make_plan(OK, 100, planner="nope")
    assert "nope" in str(info.value)


@pytest.mark.parametrize("name", ["shuffle", "drop_last"])
@pytest.mark.parametrize("value", ["false", "0"])
def test_flags_must_be_booleans(name, value):
    # bool("false") is True: a string flag would silently do the opposite
    with pytest.raises(TypeError, match=f"{name}.*{re.escape(repr(value))}"):
        make_plan(OK, 100, **{name: value})


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 0, 1])
def test_flags_accept_booleans(value):
    # taken as the bool they stand for: the same plan as with True / False
    got = make_plan(OK, 100, shuffle=value, drop_last=value)
    assert got.fingerprint() == make_plan(OK, 100, shuffle=bool(value), drop_last=bool(value)).fingerprint()
    assert got.num_steps >= 1


@pytest.mark.parametrize(
    "lengths",
    [[], (), np.array([], dtype=np.int64), np.array([]), np.zeros(0, dtype=np.float32), torch.tensor([])],
    ids=["list", "tuple", "int64", "float64", "float32", "torch"],
)
@pytest.mark.parametrize("world_size, drop_last", [(1, False), (4, False), (4, True)])
def test_empty_lengths_plan_zero_steps(lengths, world_size, drop_last):
    plan = make_plan(lengths, 100, world_size=world_size, drop_last=drop_last)
    assert plan.num_steps == 0
    assert plan.num_padded == 0 and plan.num_dropped == 0
    assert plan.batch_sizes().shape == (0, world_size)


def test_fractional_budget_is_floored_not_refused():
    a = make_plan(list(range(1, 60)), 100.7, max_batch_size=8, world_size=2)
    b = make_plan(list(range(1, 60)), 100, max_batch_size=8, world_size=2)
    assert a.fingerprint() == b.fingerprint()


anything = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.floats(), st.just(object()))
fuzz_lengths = st.one_of(
    st.lists(st.integers(-2, 60), max_size=30),
    st.lists(st.integers(0, 2**64), max_size=5),
    st.lists(st.floats(), max_size=5),
    st.lists(st.one_of(st.integers(0, 9), anything), max_size=5),
    st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=3),
    st.integers(-3, 3),
    anything,
)


VALID = dict(
    lengths=st.lists(st.integers(0, 60), max_size=30),
    max_batch_tokens=st.integers(1, 200),
    max_batch_size=st.integers(1, 10),
    world_size=st.integers(1, 5),
    seed=st.integers(-(2**80), 2**80),
    epoch=st.integers(0, 2**70),
    planner=st.just("greedy"),
    drop_last=st.booleans(),
)
INVALID = dict(
    lengths=fuzz_lengths,
    max_batch_tokens=st.one_of(st.integers(-3, 2**70), anything),
    max_batch_size=st.one_of(st.integers(-3, 2**70), anything),
    world_size=st.one_of(st.integers(-3, 12), anything),
    seed=anything,
    epoch=st.one_of(st.integers(-3, 2**70), anything),
    planner=st.one_of(st.sampled_from(["nope", "GREEDY", ""]), anything),
    drop_last=st.booleans(),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.sets(st.sampled_from(sorted(VALID)), max_size=2), st.data())
def test_fuzz_plan_or_clear_error(corrupt, data):
    """Any argument mix gives a Plan or exactly ValueError/TypeError (no Numba or numpy error)."""
    kwargs = {k: data.draw((INVALID if k in corrupt else VALID)[k], label=k) for k in sorted(VALID)}
    lengths = kwargs.pop("lengths")
    try:
        plan = make_plan(lengths, **kwargs)
    except (ValueError, TypeError) as exc:
        assert type(exc) in (ValueError, TypeError), f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        assert str(exc)
        event(type(exc).__name__)
        return
    event("planned")
    assert isinstance(plan, Plan)
    n = len(lengths)
    used = np.concatenate([plan.samples, plan.leftover]) if n else plan.samples
    assert set(used.tolist()) == set(range(n))
