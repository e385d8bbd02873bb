"""The measured step cost model: CostModel.step, its JSON file, the NNLS fit,
the timing loop, `streambatch calibrate` and the time report of `plan`."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.cli import main
from streambatch.core.cost import CostModel, resolve_cost
from streambatch.core.cost_fit import calibrate, design_shapes, features, fit_step
from streambatch.planners import make_plan
from tests.support.helpers import examples


def test_plain_models_keep_their_repr_and_kernel_form():
    # the repr is part of saved configuration fingerprints: it must not change
    assert repr(CostModel.quadratic()) == "CostModel(kind='quadratic', q=0)"
    assert repr(CostModel.linear()) == "CostModel(kind='linear', q=0)"
    assert repr(CostModel.quadratic_duration(1500)) == "CostModel(kind='quadratic_duration', q=1500)"
    for m, coef, scale in ((CostModel.quadratic(), (1, 0), 1), (CostModel.linear(), (0, 1), 1),
                           (CostModel.quadratic_duration(7), (1, 7), 7)):
        assert m.plain is m and m.coefficients == coef and m.scale == scale and m.per_step == 0.0


def test_step_models_balance_as_their_plain_equivalent():
    s = CostModel.step(0.05, 2e-6, 1e-9)
    assert s.plain == CostModel.quadratic_duration(2000) and s.coefficients == (1, 2000) and s.scale == 2000
    assert CostModel.step(0.1, 1e-6, 0).plain == CostModel.linear()
    assert CostModel.step(0.1, 0, 1e-9).plain == CostModel.quadratic()
    assert CostModel.step(0.1, 1e-10, 1e-9).plain == CostModel.quadratic()  # c1 / c2 < 0.5
    # seconds, not proxy units: c1*B*L + c2*B*L^2, and the per-step c0 in the epoch time
    assert s.batch_cost(4, 100) == pytest.approx(4 * 100 * 2e-6 + 4 * 100**2 * 1e-9)
    assert s.plain.batch_cost(4, 100) * s.seconds_per_unit == pytest.approx(s.batch_cost(4, 100))
    costs = np.array([[1.0, 2.0], [3.0, 0.5]])
    assert s.epoch_time(costs) == pytest.approx(2 + 3 + 2 * 0.05)
    assert CostModel.quadratic().epoch_time(costs) == 5.0


@pytest.mark.parametrize("seed", range(6))
def test_bucketed_plans_under_a_step_model_without_c0_are_its_plain_models_plans(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(5.5, 0.6, 3000).astype(np.int64) + 1
    c1, c2 = 10 ** rng.uniform(-7, -5), 10 ** rng.uniform(-10, -8)
    step = CostModel.step(0.0, c1, c2)  # no per-step term: exactly the plain model's plans
    kw = dict(max_batch_size=64, world_size=int(rng.integers(1, 9)), seed=seed, planner="bucketed")
    a = make_plan(lengths, 16000, cost=step, **kw)
    b = make_plan(lengths, 16000, cost=step.plain, **kw)
    assert np.array_equal(a.samples, b.samples) and np.array_equal(a.offsets, b.offsets)
    # max_step_cost is in seconds for a step model
    cap = float(np.quantile(step.batch_cost(1, lengths), 0.999)) * 40
    a = make_plan(lengths, 16000, cost=step, max_step_cost=cap, **kw)
    b = make_plan(lengths, 16000, cost=step.plain, max_step_cost=cap / step.seconds_per_unit, **kw)
    assert np.array_equal(a.samples, b.samples) and np.array_equal(a.offsets, b.offsets)


def test_cost_files_round_trip_and_bad_ones_say_what_to_do(tmp_path):
    s = CostModel.step(0.0123, 4.5e-6, 6.7e-9)
    path = tmp_path / "cost.json"
    s.save(path, fit={"median_abs_error_pct": 3.0})
    assert CostModel.load(path) == s and resolve_cost(str(path)) == s and resolve_cost(path) == s
    assert json.loads(path.read_text())["fit"]["median_abs_error_pct"] == 3.0
    for m in (CostModel.quadratic(), CostModel.quadratic_duration(9)):
        m.save(tmp_path / "p.json")
        assert CostModel.load(tmp_path / "p.json") == m
    with pytest.raises(ValueError, match="cannot read the cost model"):
        CostModel.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="is not JSON"):
        CostModel.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"c0": 1}')
    with pytest.raises(ValueError, match="streambatch calibrate"):
        CostModel.load(tmp_path / "other.json")
    with pytest.raises(ValueError, match="c1 > 0 or c2 > 0"):
        CostModel.step(0.1, 0, 0)
    with pytest.raises(ValueError, match="c2 must be a finite number of seconds >= 0"):
        CostModel.step(0.1, 1e-6, -1e-9)
    with pytest.raises(ValueError, match="c0 must be"):
        CostModel.step(float("nan"), 1e-6, 0)
    with pytest.raises(ValueError, match="only apply to kind='step'"):
        CostModel("quadratic", 0, 0.1)
    with pytest.raises(ValueError, match="cost='cost.json'"):
        resolve_cost("step")
    with pytest.raises(ValueError, match="unknown option.*takes no options"):  # greedy: the seed's B*L^2 only
        make_plan(np.full(10, 5), 100, cost=s, planner="greedy")


def test_design_shapes_span_the_budget():
    s = design_shapes(16000, 1500, 64)
    assert s.dtype == np.int64 and s.shape[1] == 2 and len(s) >= 12
    assert s[:, 1].max() == 1500 and s[:, 1].min() == 47 and s[:, 0].min() == 1
    assert (s[:, 0] <= 64).all() and ((s[:, 0] * s[:, 1] <= 16000) | (s[:, 0] == 1)).all()
    with pytest.raises(ValueError, match="max_length must be an integer >= 1"):
        design_shapes(16000, 0)


@settings(max_examples=examples(200), deadline=None)
@given(st.data())
def test_fit_is_the_nonnegative_least_squares_optimum(data):
    """KKT conditions of min ||A c - 1||^2, c >= 0 (A: relative-error rows): a
    free coefficient has zero gradient, a clamped one a gradient >= 0."""
    k = data.draw(st.integers(3, 12))
    b = np.array(data.draw(st.lists(st.integers(1, 64), min_size=k, max_size=k)))
    L = np.array(data.draw(st.lists(st.integers(1, 2000), min_size=k, max_size=k)))
    t = np.array(data.draw(st.lists(st.floats(1e-4, 10.0), min_size=k, max_size=k)))
    shapes = np.stack([b, L], axis=1)
    c = np.array(fit_step(shapes, t))
    assert (c >= 0).all()
    a = features(shapes) / t[:, None]
    norms = np.linalg.norm(a, axis=0)
    an, cn = a / norms, c * norms
    grad = an.T @ (an @ cn - 1.0)
    scale = max(1.0, float(np.abs(an).sum()))
    for j in range(3):
        if cn[j] > 1e-9:
            assert abs(grad[j]) <= 1e-6 * scale, (j, grad, cn)
        else:
            assert grad[j] >= -1e-6 * scale, (j, grad, cn)


def test_fit_recovers_exact_coefficients():
    shapes = design_shapes(8000, 1000, 64)
    for c in ((0.05, 2e-6, 3e-9), (0.0, 1e-5, 0.0), (0.2, 0.0, 1e-8)):
        t = c[0] + features(shapes)[:, 1] * c[1] + features(shapes)[:, 2] * c[2]
        assert np.allclose(fit_step(shapes, t), c, rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match=">= 3 shapes"):
        fit_step(shapes[:2], np.ones(2))
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_step(shapes[:3], np.array([1.0, 0.0, 1.0]))


class FakeClock:
    """A clock the step function advances: timing without a busy machine's noise."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_calibrate_times_each_shape_and_stays_within_its_time():
    clock, calls = FakeClock(), []
    c = (0.03, 4e-6, 2e-9)

    def step(b, L):
        calls.append((b, L))
        clock.now += c[0] + b * L * (c[1] + c[2] * L)

    coefficients, report = calibrate(step, max_batch_tokens=4000, max_length=800, repeats=3, warmup=2, clock=clock)
    assert coefficients == pytest.approx(c, rel=1e-6)
    n = report["shapes_designed"]
    assert report["shapes_timed"] == n and len(calls) == 2 + n * 4  # warm-up, then 1 untimed + 3 timed per shape
    assert report["median_abs_error_pct"] < 1e-6 and len(report["shapes"]) == n
    clock2 = FakeClock()

    def slow(b, L):
        clock2.now += 1.0

    _, report = calibrate(slow, max_batch_tokens=4000, max_length=800, repeats=3, warmup=0, max_seconds=20,
                              clock=clock2)
    assert 3 <= report["shapes_timed"] < report["shapes_designed"] and clock2.now <= 20 + 2 * 1.0
    clock2.now = 0.0
    with pytest.raises(ValueError, match="only 1 shapes were timed"):
        calibrate(slow, max_batch_tokens=4000, max_length=800, max_seconds=0.5, warmup=0, clock=clock2)
    with pytest.raises(ValueError, match="pass shapes="):
        calibrate(slow)


STEP_SCRIPT = '''
import torch

def make_step():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    opt = torch.optim.AdamW(model.parameters())

    def step(b, L):
        x = torch.randn(b, L, 16)
        att = torch.softmax(x @ x.transpose(1, 2) / 4, -1) @ x  # an L^2 part
        loss = model(att).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step
'''


def test_fit_times_a_real_torch_model_and_calibrate_writes_its_file(tmp_path, capsys):
    script = tmp_path / "my_step.py"
    script.write_text(STEP_SCRIPT)
    out = tmp_path / "cost.json"
    code = main(["calibrate", "--script", f"{script}:make_step", "--max-batch-tokens", "2000", "--max-length", "200",
                 "--repeats", "2", "--warmup", "1", "--max-seconds", "20", "-O", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "median |error|" in text and "wrote" in text
    model = CostModel.load(out)
    assert model.kind == "step" and min(model.c0, model.c1, model.c2) >= 0
    fit = json.loads(out.read_text())["fit"]
    assert fit["shapes_timed"] >= 3 and all(r["measured_s"] > 0 for r in fit["shapes"])
    # and the sampler's planner takes the file
    plan = make_plan(np.arange(1, 400), 2000, planner="bucketed", cost=str(out))
    assert sorted(plan.samples.tolist()) == list(range(399))


def test_calibrate_script_mistakes_are_one_line(tmp_path, capsys):
    (tmp_path / "s.py").write_text("def make_step():\n    return 3\n")
    for spec, words in (("nofile.py:f", "no such file"), (f"{tmp_path}/s.py", "FILE.py:FUNCTION"),
                        (f"{tmp_path}/s.py:other", "defines no function 'other'"),
                        (f"{tmp_path}/s.py:make_step", "must return a function")):
        assert main(["calibrate", "--script", spec, "--max-batch-tokens", "100", "--max-length", "10"]) == 2
        assert words in capsys.readouterr().err


def test_plan_reports_predicted_time_with_a_fitted_cost(tmp_path, capsys):
    lengths = np.random.default_rng(0).lognormal(5, 0.5, 4000).astype(np.int64) + 1
    np.save(tmp_path / "l.npy", lengths)
    cost = CostModel.step(0.05, 2e-6, 1e-9)
    cost.save(tmp_path / "cost.json")
    args = ["plan", str(tmp_path / "l.npy"), "--max-batch-tokens", "8000", "--world-size", "4", "--planner",
            "bucketed", "-o", f"cost={tmp_path / 'cost.json'}"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "predicted epoch" in text and "time bound" in text and "one-sample steps" in text
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    t = out["time"]
    assert out["cost"]["kind"] == "step" and 0 < t["bound_seconds"] <= t["epoch_seconds"]
    assert t["per_step_seconds"] == pytest.approx(0.05 * t["steps"]) and t["steps"] == out["steps"]
    plan = make_plan(lengths, 8000, world_size=4, planner="bucketed", cost=cost)
    sizes = np.diff(plan.offsets).reshape(-1, 4)[plan.step_order]
    longest = np.array([lengths[plan.samples[a:b]].max() for a, b in zip(plan.offsets[:-1], plan.offsets[1:])])
    longest = longest.reshape(-1, 4)[plan.step_order]
    assert t["epoch_seconds"] == pytest.approx(cost.epoch_time(cost.batch_cost(sizes, longest)))
    assert os.path.exists(tmp_path / "cost.json")


def heavy_tailed(n=39000, seed=1):
    """Broadcast-news-like lengths at 50 frames/s: median 6 s, a long tail to 181 s."""
    rng = np.random.default_rng(seed)
    return np.ceil(np.clip(rng.lognormal(np.log(6), 0.9, n), 0.5, 181) * 50).astype(np.int64)


def step_table(plan, lengths):
    sizes = np.diff(plan.offsets)
    longest = np.zeros(sizes.size, dtype=np.int64)
    full = np.flatnonzero(sizes > 0)
    longest[full] = np.maximum.reduceat(lengths[plan.samples], plan.offsets[full])
    w = plan.world_size
    return sizes.reshape(-1, w)[plan.step_order], longest.reshape(-1, w)[plan.step_order]


@pytest.mark.parametrize("world", [8, 64])
def test_a_per_step_cost_stops_steps_the_budget_did_not_need(world):
    """Under B*L^2 alone a step of one 30 s clip per rank costs what a full
    step of them costs per clip, so the bucketed planner laid long clips out one
    per rank: several times the steps. With a per-step cost it does not."""
    lengths = heavy_tailed()
    step = CostModel.step(0.05, 2e-6, 1e-9)
    budget = 16000
    kw = dict(max_batch_size=64, world_size=world, seed=0, planner="bucketed")
    fitted = make_plan(lengths, budget, cost=step, **kw)
    proxy = make_plan(lengths, budget, **kw)  # today's default cost, B*L^2
    greedy = make_plan(lengths, budget, 64, world, seed=0)
    for p in (fitted, proxy):  # exactly once, within budget (a lone sample may exceed it)
        assert np.array_equal(np.sort(p.samples), np.arange(lengths.size))
    sizes, longest = step_table(fitted, lengths)
    assert ((sizes * longest <= budget) | (sizes == 1)).all()
    # a clip shorter than a quarter of the budget's length alone in its batch: (almost) never
    lone_short = int(((sizes == 1) & (longest < budget // 4)).sum())
    assert lone_short <= max(8, sizes.size // 200), lone_short
    p_sizes, p_longest = step_table(proxy, lengths)
    assert int(((p_sizes == 1) & (p_longest < budget // 4)).sum()) > 10 * max(lone_short, 1)  # what it fixes
    g_sizes, g_longest = step_table(greedy, lengths)
    t = {name: step.epoch_time(step.batch_cost(*tab)) for name, tab in
         (("fitted", (sizes, longest)), ("proxy", (p_sizes, p_longest)), ("greedy", (g_sizes, g_longest)))}
    assert sizes.shape[0] <= g_sizes.shape[0] < p_sizes.shape[0]
    assert t["fitted"] < 0.9 * t["proxy"] and t["fitted"] <= t["greedy"], t
