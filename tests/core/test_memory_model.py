"""The memory model (issue 34): its arithmetic, files, the fit, the OOMptimizer-style
search of the largest batch, the curve drawn through what the search measured, and
the search against a real torch step that raises OutOfMemoryError."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.core.limits import LimitCurve
from streambatch.core.memory import MemoryModel, parse_bytes
from streambatch.core.memory_fit import Bisection, Measurement, combine_sizes, largest_batch
from streambatch.torch_glue.memory_probe import InProcessProbe, is_oom
from tests.support.helpers import examples


def test_sizes_parse_in_decimal_and_binary_units():
    assert parse_bytes("24GiB") == 24 * 2**30 and parse_bytes("800MB") == 800_000_000
    assert parse_bytes("1.5gib") == int(1.5 * 2**30) and parse_bytes(2e9) == 2_000_000_000
    assert parse_bytes("4_096") == 4096
    for bad in ("lots", "12 parsecs", -1, 0, float("nan"), True, "1e3XB"):
        with pytest.raises(ValueError, match="size like 24GiB|bytes >= 1"):
            parse_bytes(bad)


def test_peaks_and_the_largest_batch_follow_the_formula():
    m = MemoryModel(2e8, 1e4, 30.0)
    assert m.peak(4, 100) == pytest.approx(2e8 + 4 * 100 * (1e4 + 30 * 100))
    assert m.packed_peak(300, 50_000) == pytest.approx(2e8 + 1e4 * 300 + 30 * 50_000)
    limit = parse_bytes("1GiB")
    b = m.max_batch_size(np.arange(1, 3000), limit, 0.9)
    for L in (1, 17, 500, 2999):
        k = int(b[L - 1])
        assert m.peak(k, L) <= 0.9 * limit < m.peak(k + 1, L)
    curve = m.limit_curve(limit, 3000, 0.9)
    assert np.array_equal(curve.max_batch_size(np.arange(1, 3000)), b)
    with pytest.raises(ValueError, match="m1 > 0 or m2 > 0"):
        MemoryModel(1e8, 0, 0)
    with pytest.raises(ValueError, match="m0 must be a finite number of bytes"):
        MemoryModel(-1, 1, 1)
    with pytest.raises(ValueError, match="margin must be a fraction"):
        m.max_batch_size(10, limit, 1.5)


def test_memory_files_round_trip_with_what_the_calibration_found(tmp_path):
    m = MemoryModel(3e8, 2e3, 12.5, measured="cuda_max_memory_allocated", device="cuda:0 (H200)")
    curve = m.limit_curve("80GiB", 4000, 0.9)
    m.save(tmp_path / "memory.json", fit={"shapes": []}, limits=curve, limit_bytes=parse_bytes("80GiB"), margin=0.9)
    back = MemoryModel.load(tmp_path / "memory.json")
    assert back == m and back.limits == curve and back.limit_bytes == 80 * 2**30 and back.margin == 0.9
    assert LimitCurve.load(tmp_path / "memory.json") == curve  # the curve reads from the memory file too
    d = json.loads((tmp_path / "memory.json").read_text())
    assert d["format"] == "streambatch-memory" and d["version"] == 1
    d["version"] = 7
    (tmp_path / "new.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="format version 7"):
        MemoryModel.load(tmp_path / "new.json")
    (tmp_path / "cost.json").write_text(json.dumps({"format": "streambatch-cost", "version": 1, "kind": "linear"}))
    with pytest.raises(ValueError, match="not a streambatch memory model"):
        MemoryModel.load(tmp_path / "cost.json")


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(0, 5000), st.integers(1, 6000), st.integers(1, 6000), st.sampled_from([0.01, 0.05, 0.3]))
def test_the_search_brackets_the_true_largest_batch(true_max, guess, cap, rel_gap):
    calls = []

    def fits(b):
        calls.append(b)
        return b <= true_max

    ok, fail, trials = largest_batch(fits, guess, cap, rel_gap, max_trials=64)
    assert all(1 <= b <= cap for b in calls) and trials == [(b, b <= true_max) for b in calls]
    assert ok == min(true_max, cap) if fail is None else ok <= true_max < fail
    if fail is not None:
        assert fail - ok <= 1 or (fail - ok) / fail <= rel_gap
    else:
        assert ok == cap  # nothing failed: the cap fits
    assert len(calls) <= 2 * np.log2(cap + 1) + 4


def synthetic(m0, m1, m2, oom_above=None, noise=0.0):
    rng = np.random.default_rng(0)

    def probe(b, L):
        p = m0 + m1 * b * L + m2 * b * L * L
        if oom_above is not None and p > oom_above:
            return Measurement(None, True)
        return Measurement(int(p * (1 + noise * rng.uniform(-1, 1))), False)

    return probe


def test_the_fit_recovers_the_coefficients_and_the_search_draws_the_curve():
    m0, m1, m2 = 3e8, 5e3, 40.0
    limit = parse_bytes("2GiB")
    model = MemoryModel.fit(synthetic(m0, m1, m2, oom_above=limit), max_batch_tokens=40_000, max_length=2000,
                            limit_bytes="2GiB", margin=0.9, bisect=3)
    assert (model.m0, model.m1, model.m2) == pytest.approx((m0, m1, m2), rel=1e-6)
    r = model.fit_report
    assert r["median_abs_error_pct"] < 1e-6 and r["out_of_memory"]  # the budget's largest shapes ran out
    with pytest.raises(ValueError, match="margin must be a fraction"):
        MemoryModel.fit(synthetic(m0, m1, m2), max_batch_tokens=4000, max_length=200, limit_bytes=limit, margin=2)
    assert model.measured == "probe" and model.limit_bytes == limit and model.margin == 0.9
    for b in r["bisection"]:  # exact peaks: the search agrees with the model within its gap
        assert b["largest_fitting"] <= b["model_batch"] < (b["smallest_failing"] or 10**9)
    L = np.arange(1, 2001)
    assert (model.limits.max_batch_size(L) <= model.max_batch_size(L, limit, 0.9)).all()
    assert (model.limits.max_batch_size(L) >= 0.95 * model.max_batch_size(L, limit, 0.9) - 1).all()


def test_the_curve_follows_the_search_where_the_model_is_wrong():
    # the measured step needs 30 % more than the model fitted on small shapes says: the curve must not trust it
    model_sizes = np.array([1000] + [int(1e6 / L) for L in range(1, 1001)], dtype=np.int64)
    found = [Bisection(100, int(1e4), int(1e4 / 1.3), int(1e4 / 1.3) + 5, ()),
             Bisection(1000, 1000, int(1000 / 1.3), int(1000 / 1.3) + 2, ())]
    sizes = combine_sizes(model_sizes, found)
    truth = np.floor(np.array([1e6] + [1e6 / L for L in range(1, 1001)]) / 1.3)
    assert (sizes[1:] <= truth[1:] + 1).all()  # never above what fits (the ratio is interpolated exactly here)
    assert sizes[100] == found[0].ok and sizes[1000] == found[1].ok
    assert (sizes[101:1001] <= found[0].fail - 1).all() and (sizes[:1001] >= found[1].ok).all()
    # a search that stopped at its cap (nothing failed) says the model may be right: it is not scaled down
    capped = combine_sizes(model_sizes, [Bisection(10, int(1e5), 1024, None, ()), found[1]])
    assert capped[10] == model_sizes[10] and capped[1000] == found[1].ok


def test_the_search_runs_a_real_step_that_raises_out_of_memory():
    # a real torch step (attention-like B x L x L scores) that raises OutOfMemoryError past a budget, as
    # torch.cuda does at the device's limit: the search finds the boundary exactly
    budget = 600_000  # scores elements

    def step(b, L):
        if b * L * L > budget:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {b * L * L * 4} bytes")
        x = torch.randn(b, L, 8, requires_grad=True)
        (x @ x.transpose(1, 2)).softmax(-1).sum().backward()

    probe = InProcessProbe(step)
    for L in (100, 350, 1000):  # 60, 4 and 0 fit: the last length fits no batch at all
        ok, fail, trials = largest_batch(lambda b, L=L: not probe(b, L).oom, 2, 4096, rel_gap=1e-9)
        assert ok == budget // (L * L) and fail == ok + 1, (L, trials)
    assert is_oom(torch.OutOfMemoryError("x")) and is_oom(MemoryError()) and not is_oom(ValueError("x"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    with pytest.raises(ValueError, match="boom"):  # any other failure is the user's bug: it propagates
        InProcessProbe(lambda b, L: (_ for _ in ()).throw(ValueError("boom")))(1, 1)
