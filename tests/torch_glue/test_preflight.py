"""Preflight (issue 34): the plan's worst batches through the user's step before training.

Fast: a real torch step that raises OutOfMemoryError past a B * L**2 budget (as a GPU does at
its limit) is caught on a planted over-limit batch, with the fix named; the fix works; the
sampler's and the streaming dataset's batches and states are the same with and without a
preflight; the batches tried are the undominated ones (a naive twin). Slow: a small real model
whose memory grows with B * L**2, calibrated from the peak resident memory of a subprocess per
shape; every batch of an epoch planned under its limit curve stays under the limit when run."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import DynamicBatchSampler, make_plan
from streambatch.cli.main import main
from streambatch.core.limits import BatchShapes, LimitCurve
from streambatch.core.memory import MemoryModel
from streambatch.core.memory_fit import Measurement
from streambatch.streaming import StreamingBatches
from streambatch.torch_glue.memory_probe import SubprocessProbe
from streambatch.torch_glue.preflight import PreflightError, frontier, run_preflight
from tests.support.helpers import examples, lognormal_lengths

BUDGET = 3_000_000  # B * L**2 a step may hold


def limited_step(budget: int = BUDGET, log: list | None = None):
    """A real (tiny) attention step that raises torch.OutOfMemoryError when B * L**2 > budget."""
    def step(b: int, L: int) -> None:
        if log is not None:
            log.append((b, L))
        if b * L * L > budget:
            raise torch.OutOfMemoryError(f"CUDA out of memory: B={b} L={L}")
        x = torch.randn(b, min(L, 64), 4, requires_grad=True)
        (x @ x.transpose(1, 2)).softmax(-1).sum().backward()
    return step


def planted_lengths() -> np.ndarray:
    # short clips plus a handful of long ones: a token budget fit for the short ones packs the long ones
    # into batches whose attention is far over what the step holds
    lengths = lognormal_lengths(3000, seed=1) // 4 + 10
    lengths[::300] = 800
    return lengths


def test_preflight_catches_a_planted_over_limit_batch_and_names_the_fix():
    lengths = planted_lengths()
    s = DynamicBatchSampler(lengths, 8000, 64, planner="bucketed", world_size=2, rank=1)
    with pytest.raises(PreflightError) as info:
        s.preflight(limited_step())
    report = info.value.report
    bad = report.failed[0]
    assert bad.oom and bad.max_len == 800 and bad.count * 800 * 800 > BUDGET
    # the fitting batch at that length was searched by running the step: 4 * 800**2 <= 3e6 < 5 * 800**2
    assert report.largest_fitting == BUDGET // 800**2 == 4
    msg = str(info.value)
    assert f"step {bad.step} rank {bad.rank} ({bad.count} x 800), ran out of memory" in msg
    assert "max_batch_tokens <= 3200" in msg and "max_length below 800" in msg
    # every batch shape tried is a real batch of the plan (any rank's), at its step
    for r in report.rows:
        assert r.count == len(s.plan.batch(r.step, r.rank)) and r.max_len == lengths[s.plan.batch(r.step, r.rank)].max()
    # the named fix fits: planned with it, the worst batches run
    fixed = DynamicBatchSampler(lengths, 3200, 64, planner="bucketed", world_size=2, rank=1)
    assert fixed.preflight(limited_step()).ok


class Accounted:
    """A probe whose step holds 100 bytes per B * L**2 element and has 3e8 bytes: exact peaks."""

    measured = "accounted"

    def __init__(self):
        self.calls = []

    def __call__(self, b, L):
        self.calls.append((b, L))
        peak = 100 * b * L * L
        return Measurement(None if peak > 3e8 else peak, peak > 3e8)


def test_preflight_with_a_memory_model_ranks_by_it_and_reports_headroom():
    lengths = planted_lengths()
    s = DynamicBatchSampler(lengths, 8000, 64, planner="bucketed")
    model = MemoryModel(0.0, 1e-9, 100.0)  # the model of that step
    probe = Accounted()
    report = s.preflight(probe, memory=model, limit_bytes=3e8, raise_on_failure=False)
    assert not report.ok and report.rows[0].predicted_bytes == max(r.predicted_bytes for r in report.rows)
    assert report.fix.startswith("Fix: max_batch_tokens <= 3200 (the largest batch that fits at length 800 is 4 "
                                 "by the memory model)")
    assert len(probe.calls) == len(report.rows)  # the model named the fix: no search
    for r in report.rows:
        assert r.oom or r.headroom_bytes == pytest.approx(3e8 - 100 * r.count * r.max_len**2)
    s2 = DynamicBatchSampler(lengths, 3200, 64, planner="bucketed")
    ok = s2.preflight(Accounted(), memory=model, limit_bytes=3e8)
    assert ok.ok and all(r.predicted_bytes <= 3e8 and r.peak_bytes == pytest.approx(r.predicted_bytes) for r in ok.rows)
    assert "every batch tried fits" in str(ok)


def test_preflight_changes_neither_the_plan_nor_the_position():
    lengths = planted_lengths()
    a = DynamicBatchSampler(lengths, 3200, 64, planner="bucketed", world_size=2, rank=0, seed=5)
    b = DynamicBatchSampler(lengths, 3200, 64, planner="bucketed", world_size=2, rank=0, seed=5)
    a.preflight(limited_step())
    b.set_epoch(1)
    a.set_epoch(1)
    ia, ib = iter(a), iter(b)
    got_a, got_b = [next(ia) for _ in range(5)], [next(ib) for _ in range(5)]
    assert a.state_dict() == b.state_dict()
    state = a.state_dict()
    a.preflight(limited_step())
    assert a.state_dict() == state == b.state_dict()
    assert got_a + list(ia) == got_b + list(ib)
    assert a.plan.fingerprint() == b.plan.fingerprint()


def test_streaming_preflight_reads_no_tar_and_keeps_the_position(make_corpus):
    corpus = make_corpus([40, 40, 40], seed=3, longest=0.6)
    brace, expected = corpus.brace, corpus.expected

    def make():
        return StreamingBatches(brace, 600, 16, window_samples=50, rank=0, world_size=2, planner="bucketed")

    def keys(ds):
        return [tuple(x["__key__"] for x in batch) for batch in ds]

    ds, ref = make(), make()
    ds.set_epoch(1)
    ref.set_epoch(1)
    log: list = []
    longest = max(expected.values())
    budget = 3 * longest * longest  # the longest clip fits alone, but not four of them padded together
    report = ds.preflight(limited_step(budget, log), raise_on_failure=False)
    shapes = {(r.count, r.max_len) for r in report.rows}
    assert set(log) >= shapes and len(report.rows) >= 2
    # the shapes are the epoch's (every rank's) batches, planned from the sidecars' lengths
    lens = {k: v for k, v in expected.items()}
    planned = set()
    for r in range(2):
        other = StreamingBatches(brace, 600, 16, window_samples=50, rank=r, world_size=2, planner="bucketed")
        other.set_epoch(1)
        planned |= {(len(b), max(lens[x["__key__"]] for x in b)) for b in other}
    assert shapes <= planned
    assert any(r.max_len == longest for r in report.rows)
    assert report.ok == all(c * L * L <= budget for c, L in shapes)
    assert ds.state_dict() == ref.state_dict()
    assert keys(ds) == keys(ref)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 12)), min_size=1, max_size=60))
def test_the_batches_tried_are_the_undominated_ones(pairs):
    c = np.array([p[0] for p in pairs], dtype=np.int64)
    L = np.array([p[1] for p in pairs], dtype=np.int64)
    got = frontier(c, L)
    shapes = {(int(c[i]), int(L[i])) for i in got}
    assert len(shapes) == got.size  # one per distinct shape
    naive = {(a, b) for a, b in pairs if not any((x >= a and y >= b) and (x, y) != (a, b) for x, y in pairs)}
    assert shapes == naive


def test_preflight_of_packed_batches_runs_their_padded_equivalent():
    lengths = planted_lengths()
    plan = make_plan(lengths, 8000, 64, planner="bucketed", pack=True)
    shapes = BatchShapes.of_plan(plan, lengths)
    log: list = []
    report = run_preflight(shapes, limited_step(10**12, log), packed=True, top=2, longest=1)
    for r in report.rows:
        batch = lengths[plan.batch(r.step, r.rank)]
        assert r.tokens == batch.sum() and r.run_batch == -(-batch.sum() // batch.max()) >= 1
        assert (r.run_batch, r.max_len) in log


def test_preflight_arguments_are_checked():
    shapes = BatchShapes.of_plan(make_plan(np.arange(1, 50), 200), np.arange(1, 50))
    with pytest.raises(ValueError, match="top must be a whole number"):
        run_preflight(shapes, limited_step(), top=-1)
    with pytest.raises(TypeError, match="step must be a function"):
        run_preflight(shapes, 3)
    with pytest.raises(TypeError, match="MemoryModel or a memory JSON"):
        run_preflight(shapes, limited_step(), memory=object())


STEP_SCRIPT = '''
import torch

BUDGET = 3_000_000

def make_step():
    def step(b, L):
        if b * L * L > BUDGET:
            raise torch.OutOfMemoryError("out of memory")
        x = torch.randn(b, min(L, 32), 4)
        (x @ x.transpose(1, 2)).sum()
    return step
'''


def test_the_preflight_command_fails_with_the_fix_and_passes_with_it(tmp_path, capsys):
    (tmp_path / "step.py").write_text(STEP_SCRIPT)
    np.save(tmp_path / "l.npy", planted_lengths())
    args = ["preflight", str(tmp_path / "l.npy"), "--script", f"{tmp_path}/step.py:make_step", "--planner",
            "bucketed", "--in-process", "--device", "cpu", "-w", "2"]
    assert main([*args, "-t", "8000"]) == 1
    out = capsys.readouterr().out
    assert "OUT OF MEMORY" in out and "max_batch_tokens <= 3200" in out
    assert main([*args, "-t", "3200", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["rows"] and all(r["ok"] for r in report["rows"])
    assert main([*args, "-t", "3200", "--script", "nope.py:f"]) == 2
    assert "no such file" in capsys.readouterr().err


# ---------------------------------------------------------------- slow: a real model, real peaks

MODEL_SCRIPT = '''
import torch

def make_step():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    proj = torch.nn.Linear(32, 32)
    opt = torch.optim.AdamW(proj.parameters())

    def step(b, L):
        x = torch.randn(b, L, 32)
        h = proj(x)
        scores = (h @ h.transpose(1, 2)).softmax(-1)   # (b, L, L): memory grows with B * L**2
        loss = (scores @ h).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_limits_fitted_on_a_real_model_hold_on_its_real_peak(tmp_path):
    (tmp_path / "model.py").write_text(MODEL_SCRIPT)
    probe = SubprocessProbe(f"{tmp_path}/model.py:make_step", timeout=300)
    base = probe(1, 16).peak_bytes  # the interpreter, torch and the model: what m0 will hold
    limit = base + 160 * 2**20
    model = MemoryModel.fit(probe, max_batch_tokens=6000, max_length=700, lengths=3, limit_bytes=limit,
                            margin=0.9, bisect=2, rel_gap=0.05)
    report = model.fit_report
    print(json.dumps({k: report[k] for k in ("median_abs_error_pct", "p90_abs_error_pct",
                                             "max_under_prediction_pct", "seconds")}), model, file=sys.stderr)
    assert model.measured == "cpu_peak_rss_subprocess" and model.m2 > 0
    assert report["p90_abs_error_pct"] < 5
    curve = model.limits
    lengths = np.minimum(lognormal_lengths(4000, seed=2) // 2, 700)
    tokens, _ = curve.budget_within(700)
    plan = make_plan(lengths, tokens, 10**6, world_size=2, planner="bucketed")
    assert curve.check(plan, lengths).ok  # no batch of the epoch above the curve
    # and their real peaks: the undominated batches (the worst of the epoch) in fresh processes
    shapes = BatchShapes.of_plan(plan, lengths)
    result = run_preflight(shapes, probe, memory=model, limit_bytes=limit, top=3, longest=2)
    print(result, file=sys.stderr)
    assert result.ok and all(r.peak_bytes <= limit for r in result.rows)
    # the curve is not timid: its worst batch uses most of the memory the step may add to its base
    assert max(r.peak_bytes for r in result.rows) - base > 0.6 * (0.9 * limit - base)
    # planned under the curve itself (the planners' ``limit`` option, the fitted model's curve; the budget not
    # binding), padded and packed: no batch above the curve, and the real peaks of the worst under the limit
    for pack in (False, True):
        curved = make_plan(lengths, 10**9, 10**6, world_size=2, planner="bucketed", limit=model, pack=pack)
        assert curve.check(curved, lengths, packed=pack).ok
        if not pack:  # the curve holds more on short clips than the one budget within it
            assert curved.fewest_steps <= plan.fewest_steps
    shapes = BatchShapes.of_plan(curved, lengths)
    result = run_preflight(shapes, probe, memory=model, limit_bytes=limit, top=2, longest=1, packed=True)
    print(result, file=sys.stderr)
    assert result.ok and all(r.peak_bytes <= limit for r in result.rows)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_calibrate_memory_command_writes_the_model_and_its_curve(tmp_path, capsys):
    (tmp_path / "model.py").write_text(MODEL_SCRIPT)
    out = tmp_path / "memory.json"
    code = main(["calibrate", "--memory", "--script", f"{tmp_path}/model.py:make_step", "--device", "cpu",
                 "--max-batch-tokens", "3000", "--max-length", "400", "--memory-limit", "2GiB", "--lengths", "3",
                 "--search", "0", "-O", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "cpu_peak_rss_subprocess" in text and "limit curve:" in text
    model = MemoryModel.load(out)
    assert model.limits is not None and model.limit_bytes == 2 * 2**30 and model.margin == 0.9
    assert "bisection" not in model.fit_report  # --search 0: the model's curve alone
    assert model.limits == LimitCurve.from_sizes(model.max_batch_size(np.arange(401), 2 * 2**30, 0.9),
                                                 model.limits.source)
    assert main(["calibrate", "--memory", "--script", f"{tmp_path}/model.py:make_step", "--device", "cpu",
                 "--max-batch-tokens", "3000", "--max-length", "400"]) == 2
    assert "--memory-limit is required on a CPU" in capsys.readouterr().err
