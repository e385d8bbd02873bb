"""Plan-quality metrics against a naive loop, terminal histograms, figures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import make_plan
from streambatch.cli.report import (
    bar,
    histogram,
    nice_width,
    plan_batches,
    plot_plan,
    plot_throughput,
    quality,
    rank_batches,
    seconds_label,
    step_balance,
)
from tests.support.helpers import examples


def naive_quality(plan, lengths, budget):
    """The metric definitions, written out over ``plan.batch(step, rank)``."""
    w = plan.world_size
    real = padded = 0
    uses, balances, step_costs = [], [], []
    for s in range(plan.num_steps):
        costs = []
        for r in range(w):
            b = [int(lengths[i]) for i in plan.batch(s, r)]
            longest = max(b) if b else 0
            real += sum(b)
            padded += len(b) * longest
            if b:
                uses.append(len(b) * longest / budget)
            costs.append(len(b) * longest**2)
        balances.append(sum(costs) / (w * max(costs)) if max(costs) else 1.0)
        step_costs.append(max(costs))
    return {"padding": real / padded if padded else 1.0, "balance": float(np.mean(balances)),
            "use": float(np.mean(uses)), "spread": max(step_costs) / float(np.median(step_costs))}


@given(st.lists(st.integers(1, 400), min_size=1, max_size=300), st.integers(1, 6), st.integers(400, 3000),
       st.integers(1, 16), st.booleans())
@settings(max_examples=examples(60), deadline=None)
def test_metrics_match_the_definitions(lengths, world, budget, cap, drop_last):
    lengths = np.array(lengths, dtype=np.int64)
    plan = make_plan(lengths, budget, cap, world, drop_last=drop_last, seed=3)
    if plan.num_steps == 0:
        return
    q = quality(plan_batches(plan, lengths), budget)
    want = naive_quality(plan, lengths, budget)
    assert q.padding_efficiency == pytest.approx(want["padding"])
    assert q.balance_efficiency == pytest.approx(want["balance"])
    assert q.budget_use == pytest.approx(want["use"])
    assert q.step_cost_spread == pytest.approx(want["spread"])
    assert q.steps == plan.num_steps and q.world_size == world
    assert q.slots == plan.samples.size
    assert 0 < q.padding_efficiency <= 1 and 0 < q.balance_efficiency <= 1


def test_rank_batches_agrees_with_plan_batches():
    lengths = np.random.default_rng(0).integers(20, 900, 2000)
    plan = make_plan(lengths, 8000, 32, 4)
    delivered = [[lengths[plan.batch(s, r)] for s in range(plan.num_steps)] for r in range(4)]
    a, b = plan_batches(plan, lengths), rank_batches(delivered)
    for x, y in ((a.sizes, b.sizes), (a.longest, b.longest), (a.real, b.real)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="different numbers of steps"):
        rank_batches([delivered[0], delivered[1][:-1]])


def test_empty_batches_and_over_budget():
    # A skipped sample can leave a rank with an empty batch; a lone long sample exceeds the budget.
    b = rank_batches([[np.array([10, 10]), np.array([500])], [np.array([], dtype=np.int64), np.array([5])]])
    q = quality(b, 100)
    assert q.batches == 3 and q.over_budget == 1
    assert q.padding_efficiency == pytest.approx(525 / 525)
    np.testing.assert_allclose(step_balance(b), [0.5, (500**2 + 25) / (2 * 500**2)])


def test_histogram_counts_every_value_in_nice_bins():
    values = np.random.default_rng(1).integers(1, 65, 1000)
    lines = histogram(values, bins=12)
    counts = [int(line.split()[-2].replace(",", "")) for line in lines]
    assert sum(counts) == 1000
    assert lines[0].lstrip().startswith("0-9") and lines[-1].lstrip().startswith("60-64")
    assert len({len(line) for line in lines}) == 1  # aligned columns
    assert histogram(np.array([7, 7]))[0].split()[0] == "7"
    assert histogram(np.array([], dtype=np.int64)) == ["  (no values)"]
    assert "(2.0-4.0 s)" in seconds_label(50)(100, 199)


def test_bars_and_widths():
    assert bar(1.0, 4) == "████" and bar(0.0, 4) == "    "
    assert bar(0.5 + 1 / 32, 4) == "██▏ "
    assert [nice_width(s, 10) for s in (5, 64, 123, 1476, 99_000)] == [1, 10, 20, 200, 10_000]


# slow tier: matplotlib renders three figures (~2 s)
@pytest.mark.slow
def test_figures_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    lengths = np.random.default_rng(2).integers(20, 900, 3000)
    plan = make_plan(lengths, 8000, 32, 4)
    plot_plan(str(tmp_path / "plan.png"), plan_batches(plan, lengths), 8000, 32, title="t")
    rows = [{"planner": "greedy", "n": n, "world_size": w, "samples_per_s": n / (1e-3 * w)}
            for n in (1000, 10_000) for w in (2, 8)]
    plot_throughput(str(tmp_path / "bench.png"), rows)
    for name in ("plan.png", "bench.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def naive_packed(plan, lengths, budget, cost):
    """Packed batches' metrics written out: tokens sum(L), cost sum(L**2), a step model's sum(c1 L + c2 L**2)."""
    uses, balances, top, seconds = [], [], [], []
    for s in range(plan.num_steps):
        batches = [[int(lengths[i]) for i in plan.batch(s, r)] for r in range(plan.world_size)]
        costs = [sum(x * x for x in b) for b in batches]
        uses += [sum(b) / budget for b in batches if b]
        balances.append(sum(costs) / (plan.world_size * max(costs)))
        top.append(max(costs))
        seconds.append(cost.c0 + max(sum(cost.c1 * x + cost.c2 * x * x for x in b) for b in batches))
    return float(np.mean(uses)), float(np.mean(balances)), float(sum(top)), float(sum(seconds))


@given(st.lists(st.integers(1, 400), min_size=1, max_size=300), st.integers(1, 6), st.integers(400, 3000))
@settings(max_examples=examples(40), deadline=None)
def test_packed_metrics_count_sums_not_padding(lengths, world, budget):
    from streambatch import CostModel
    from streambatch.cli.metrics import time_report

    lengths = np.array(lengths, dtype=np.int64)
    plan = make_plan(lengths, budget, 16, world, planner="bucketed", pack=True, seed=3)
    if plan.num_steps == 0:
        return
    b = plan_batches(plan, lengths, packed=True)
    q = quality(b, budget)
    cost = CostModel.step(0.01, 2e-6, 3e-9)
    use, balance, epoch, seconds = naive_packed(plan, lengths, budget, cost)
    assert q.padding_efficiency == 1.0 and q.packed
    assert q.over_budget == 0  # lengths <= 400 < budget: every packed batch is within sum(L) <= budget
    assert q.budget_use == pytest.approx(use)
    assert q.balance_efficiency == pytest.approx(balance)
    assert q.epoch_time == pytest.approx(epoch)
    assert time_report(b, lengths, cost, budget)["epoch_seconds"] == pytest.approx(seconds)
    # the same batches read as padded would count their padding
    assert quality(plan_batches(plan, lengths), budget).padding_efficiency <= 1.0
