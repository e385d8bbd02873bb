"""Limit curves inside the planners (issue 34 item 2): the ``limit`` option.

For every planner that declares it (padded and packed): no batch above the
curve (a lone sample excepted), every sample once, equal steps, the fewest
steps with the curve (exact for padded batches); the kernels' curve checks
against naive twins; what ``limit`` accepts, and what refuses it.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import DynamicBatchSampler, make_plan
from streambatch.core.bounds import fewest_batches, step_limit
from streambatch.core.config import PlanConfig
from streambatch.core.constraint import NO_TABLE, BatchLimits
from streambatch.core.limits import LimitCurve, resolve_limit
from streambatch.core.memory import MemoryModel
from streambatch.planners import PLANNERS, UnknownOptionError
from tests.planners.test_planner_contract import check_plan
from tests.support.helpers import examples

CURVED = [(n, {}) for n in sorted(PLANNERS) if "limit" in PLANNERS[n].option_names()]
CURVED += [(n, {"pack": True}) for n, _ in list(CURVED) if "pack" in PLANNERS[n].option_names()]
IDS = [n + ("-packed" if o else "") for n, o in CURVED]


@st.composite
def curves(draw, top: int = 400) -> LimitCurve:
    """A curve with 1-5 breakpoints over lengths up to ``top`` (sizes drawn in
    any order: the curve makes them non-increasing)."""
    k = draw(st.integers(1, 5))
    upper = sorted(set(draw(st.lists(st.integers(1, top), min_size=k, max_size=k))))
    upper[-1] = max(upper[-1], top) if draw(st.booleans()) else upper[-1]  # sometimes lengths beyond the curve
    sizes = draw(st.lists(st.integers(0, 40), min_size=len(upper), max_size=len(upper)))
    return LimitCurve.from_table(upper, sizes)


def over_curve(p, lengths: np.ndarray, curve: LimitCurve, packed: bool) -> list:
    """The batches above the curve, other than a lone sample (packed: other than
    one no bigger than a lone sample of its longest length, as zero-length ones)."""
    check = curve.check(p, lengths, packed=packed)
    return [i for i in check.over.tolist() if check.shapes.count[i] > 1 and check.count[i] > 1]


def test_the_planners_that_take_a_curve():
    assert {n for n, _ in CURVED} == {"bucketed", "shard_affine"}
    assert all("limit" in PLANNERS[n].option_names() or n == "greedy" for n in PLANNERS)


@pytest.mark.filterwarnings("ignore:samples are longer than the limit curve")
@pytest.mark.parametrize("name, options", CURVED, ids=IDS)
@settings(max_examples=examples(120), deadline=None)
@given(lengths=st.lists(st.integers(0, 400), max_size=300).map(lambda x: np.array(x, dtype=np.int64)),
       curve=curves(), tokens=st.integers(1, 6000), size=st.integers(1, 70), world=st.integers(1, 9),
       shuffle=st.booleans(), drop_last=st.booleans(), seed=st.integers(0, 2**40))
def test_no_batch_exceeds_the_curve(name, options, lengths, curve, tokens, size, world, shuffle, drop_last, seed):
    """Every planner, padded and packed: within the curve (a lone sample aside), every sample once, equal
    steps, the budget and cap too; padded, within 1.05 x (shard-affine 1.10 x) the fewest with the curve + 1."""
    kw = dict(max_batch_tokens=tokens, max_batch_size=size, world_size=world, shuffle=shuffle, drop_last=drop_last,
              seed=seed, planner=name, **options)
    packed = bool(options)
    p = make_plan(lengths, limit=curve, **kw)
    check_plan(p, lengths, tokens, size, world, drop_last, packed)
    assert over_curve(p, lengths, curve, packed) == []
    limits = BatchLimits(tokens, size, pack=packed, limit=curve)
    bound = limits.bind(lengths, world).step_bound(lengths, drop_last)
    assert p.fewest_steps == bound.steps
    if not packed:
        assert p.num_steps <= step_limit(bound.steps, PLANNERS[name].step_slack)
    # the same plan again (a pure function), and without the curve the plan of no curve
    q = make_plan(lengths, limit=curve, **kw)
    assert np.array_equal(p.samples, q.samples) and np.array_equal(p.offsets, q.offsets)
    bare, none = make_plan(lengths, **kw), make_plan(lengths, limit=None, **kw)
    assert np.array_equal(bare.samples, none.samples) and np.array_equal(bare.step_order, none.step_order)


@pytest.mark.parametrize("name, options", CURVED, ids=IDS)
def test_a_binding_curve_changes_the_plan_on_real_lengths(name, options):
    rng = np.random.default_rng(3)
    lengths = rng.integers(10, 3000, size=6000)
    curve = LimitCurve.from_table([500, 1000, 2000, 3000], [60, 25, 8, 3])
    kw = dict(max_batch_tokens=60000, max_batch_size=64, world_size=4, planner=name, **options)
    packed = bool(options)
    bare = make_plan(lengths, **kw)
    assert over_curve(bare, lengths, curve, packed)  # the budget alone breaks this curve
    p = make_plan(lengths, limit=curve, **kw)
    assert over_curve(p, lengths, curve, packed) == []
    check_plan(p, lengths, 60000, 64, 4, False, packed)
    assert p.num_steps > bare.num_steps


# ------------------------------------------------------------ the fewest steps with a curve


def naive_fill(lengths: list[int], tokens: int, size: int, curve: LimitCurve | None) -> int:
    """Longest first, each batch as full as the budget, cap and curve allow at its first (longest) sample."""
    order = sorted(lengths, reverse=True)
    batches, i = 0, 0
    while i < len(order):
        top = order[i]
        k = size if top == 0 else min(size, tokens // top)
        if curve is not None:
            k = min(k, int(curve.max_batch_size(top)))
        i += max(1, k)
        batches += 1
    return batches


def brute_fewest(lengths: list[int], tokens: int, size: int, curve: LimitCurve) -> int:
    """The fewest padded batches by trying every partition (tiny inputs)."""
    n = len(lengths)
    best = [n]

    def fits(group):
        if len(group) <= 1:
            return True
        top = max(group)
        return len(group) <= size and len(group) * top <= tokens and len(group) <= int(curve.max_batch_size(top))

    def go(i, groups):
        if len(groups) >= best[0]:
            return
        if i == n:
            best[0] = len(groups)
            return
        for g in groups:
            g.append(lengths[i])
            if fits(g):
                go(i + 1, groups)
            g.pop()
        groups.append([lengths[i]])
        go(i + 1, groups)
        groups.pop()

    go(0, [])
    return best[0]


@settings(max_examples=examples(200), deadline=None)
@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=200), tokens=st.integers(1, 800),
       size=st.integers(1, 30), curve=curves(60))
def test_the_fill_kernel_with_a_curve_is_its_naive_twin(lengths, tokens, size, curve):
    arr = np.array(lengths, dtype=np.int64)
    table = curve.size_table(int(arr.max()), size)
    assert fewest_batches(arr, tokens, size, table=table) == naive_fill(lengths, tokens, size, curve)


@settings(max_examples=examples(60), deadline=None)
@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=7), tokens=st.integers(1, 80),
       size=st.integers(1, 5), curve=curves(20))
def test_the_fill_with_a_curve_is_the_fewest(lengths, tokens, size, curve):
    """The bound's claim (``core/bounds.py``): with a non-increasing curve, the fill is optimal."""
    arr = np.array(lengths, dtype=np.int64)
    table = curve.size_table(int(arr.max()), size)
    assert fewest_batches(arr, tokens, size, table=table) == brute_fewest(lengths, tokens, size, curve)


@settings(max_examples=examples(200), deadline=None)
@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=200), tokens=st.integers(1, 800),
       size=st.integers(1, 30), curve=curves(60))
def test_the_fill_sizes_kernel_with_a_curve_is_its_naive_twin(lengths, tokens, size, curve):
    from streambatch.planners.bucketed.steps import fill_sizes

    slen = np.array(sorted(lengths, reverse=True), dtype=np.int64)
    table = curve.size_table(int(slen.max()), size)
    got = fill_sizes(slen, tokens, size, table, 1, 0, np.iinfo(np.int64).max).tolist()
    want, i = [], 0
    while i < len(slen):  # each batch grows while count x running longest, the cap and the curve allow
        cnt, mx = 1, int(slen[i])
        while i + cnt < len(slen):
            nm = max(mx, int(slen[i + cnt]))
            if cnt + 1 > size or (cnt + 1) * nm > tokens or cnt + 1 > int(curve.max_batch_size(nm)):
                break
            cnt, mx = cnt + 1, nm
        want.append(cnt)
        i += cnt
    assert got == want and sum(got) == len(lengths)
    assert fill_sizes(slen, tokens, size, NO_TABLE, 1, 0, np.iinfo(np.int64).max).shape[0] <= len(got)


@pytest.mark.filterwarnings("ignore:samples are longer than the limit curve")
@settings(max_examples=examples(150), deadline=None)
@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=40), tokens=st.integers(1, 800),
       size=st.integers(1, 30), curve=curves(60))
def test_the_packed_bound_with_a_curve_is_below_every_packing_found(lengths, tokens, size, curve):
    """The packed bound is a lower bound: no plan the packed planners make has fewer batches."""
    arr = np.array(lengths, dtype=np.int64)
    limits = BatchLimits(tokens, size, pack=True, limit=curve)
    b = limits.bind(arr, 1).step_bound(arr, False).batches
    for name in ("bucketed", "shard_affine"):
        p = make_plan(arr, tokens, size, planner=name, pack=True, limit=curve, shuffle=False)
        assert b <= p.num_steps


@settings(max_examples=examples(200), deadline=None)
@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=200), tokens=st.integers(1, 800),
       size=st.integers(1, 30), curve=curves(60))
def test_the_packed_curve_bound_kernel_is_its_naive_twin(lengths, tokens, size, curve):
    """``token_fill_count`` (the fractional fill of ``core/bounds.py``'s packed curve bound) against the same fill
    in exact fractions: longest first, each batch ``C*`` of its first sample's length in tokens, samples divisible."""
    from fractions import Fraction

    from streambatch.core.bounds import _curve_bound

    arr = np.array(lengths, dtype=np.int64)
    lmax = int(arr.max())
    table = curve.size_table(lmax, size)
    room_of = [min(tokens, int(table[L]) * L) for L in range(lmax + 1)]
    best = [max(max(room_of[L:]), 1) for L in range(lmax + 1)]  # C*(l)
    batches, room = 0, Fraction(0)
    for v in sorted({x for x in lengths if x > 0}, reverse=True):
        need = Fraction(v * lengths.count(v))
        take = min(room, need)
        room, need = room - take, need - take
        if need > 0:
            opened = -(-need // best[v])
            batches += int(opened)
            room = opened * best[v] - need
    values, counts = np.unique(arr, return_counts=True)
    assert _curve_bound(values[::-1].copy(), counts[::-1].copy(), tokens, table) == batches


# ------------------------------------------------------------ what limit accepts


def test_limit_takes_a_curve_a_model_a_file_a_profile_and_a_table(tmp_path):
    curve = LimitCurve.from_table([100, 200], [8, 2])
    assert resolve_limit(None) is None and resolve_limit(curve) is curve
    curve.save(tmp_path / "limits.json")
    assert resolve_limit(str(tmp_path / "limits.json")) == curve
    model = MemoryModel(1e6, 10.0, 0.5)
    with pytest.raises(ValueError, match="limit_bytes"):
        resolve_limit(model)
    model._attach(None, curve, 2**30, 0.9)
    assert resolve_limit(model) == curve
    model.save(tmp_path / "memory.json")
    assert resolve_limit(tmp_path / "memory.json") == curve
    profile = {"bucket_duration_bins": [100, 200], "bucket_batch_size": [8, 2]}
    assert resolve_limit(profile).max_batch_size([50, 150, 250]).tolist() == [8, 2, 0]
    assert resolve_limit([5, 5, 3, 3, 1]).max_batch_size([1, 2, 3, 4, 5]).tolist() == [5, 3, 3, 1, 0]
    with pytest.raises(TypeError, match="LimitCurve"):
        resolve_limit(3.5)
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ValueError, match="neither a limit curve"):
        resolve_limit(tmp_path / "junk.json")


def test_samples_beyond_the_curve_warn_naming_units_and_the_fix():
    """A profile in seconds read as frames would plan every sample alone: loud."""
    curve = LimitCurve.from_table([3, 6], [8, 2])  # e.g. seconds, while the lengths are frames
    with pytest.warns(UserWarning, match="frames_per_second.*max_length=6"):
        p = make_plan(np.arange(100, 200), 10_000, 64, planner="bucketed", limit=curve)
    assert (np.diff(p.offsets) == 1).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_plan(np.arange(1, 7), 10_000, 64, planner="bucketed", limit=curve)  # within it: silent


def test_the_greedy_planner_refuses_a_curve_naming_the_fix():
    curve = LimitCurve.from_table([100], [4])
    with pytest.raises(UnknownOptionError, match="planner='bucketed'.*budget_within"):
        make_plan([5] * 20, 100, 8, limit=curve)
    with pytest.raises(UnknownOptionError, match="planner='bucketed'"):
        DynamicBatchSampler([5] * 20, 100, 8, limit=curve)


def test_the_curve_enters_the_fingerprint_and_no_curve_changes_nothing():
    a = LimitCurve.from_table([100, 200], [8, 2])
    b = LimitCurve.from_table([100, 200], [8, 3])
    c = PlanConfig.build(1000, 16, planner="bucketed", planner_options={"limit": a})
    d = PlanConfig.build(1000, 16, planner="bucketed", planner_options={"limit": b})
    e = PlanConfig.build(1000, 16, planner="bucketed")
    lengths = np.arange(1, 50, dtype=np.int64)
    assert len({c.fingerprint(lengths), d.fingerprint(lengths), e.fingerprint(lengths)}) == 3
    assert c.fingerprint(lengths) == PlanConfig.build(1000, 16, planner="bucketed",
                                                      planner_options={"limit": LimitCurve.from_table(
                                                          [100, 200], [8, 2])}).fingerprint(lengths)
    assert e.key() == (1000, 16, True, False, 1, 42, "bucketed", "[]")  # the version-1 scheme, unchanged


def test_the_sampler_plans_within_the_curve_and_resumes_under_it():
    rng = np.random.default_rng(5)
    lengths = rng.integers(10, 400, size=900)
    curve = LimitCurve.from_table([100, 250, 400], [30, 8, 2])
    s = DynamicBatchSampler(lengths, 8000, 64, rank=0, world_size=1, planner="bucketed", limit=curve)
    for batch in s:
        top = int(lengths[batch].max())
        assert len(batch) == 1 or len(batch) <= int(curve.max_batch_size(top))
    full = [list(b) for b in DynamicBatchSampler(lengths, 8000, 64, rank=0, world_size=1, planner="bucketed",
                                                 limit=curve)]
    it = iter(s)
    next(it)
    state = s.state_dict()
    other = DynamicBatchSampler(lengths, 8000, 64, rank=0, world_size=1, planner="bucketed",
                                limit=LimitCurve.from_table([100, 250, 400], [30, 8, 3]))
    with pytest.raises(ValueError):
        other.load_state_dict(state)
    same = DynamicBatchSampler(lengths, 8000, 64, rank=0, world_size=1, planner="bucketed", limit=curve)
    same.load_state_dict(state)
    assert [list(b) for b in same] == full[1:]


@pytest.mark.parametrize("read_mode", ["sample", "shard"])
@pytest.mark.parametrize("pack", [False, True])
def test_streaming_plans_within_the_curve(make_corpus, read_mode, pack):
    corpus = make_corpus([40, 40, 40], seed=3, longest=0.6)
    longest = max(corpus.expected.values())
    curve = LimitCurve.from_table([longest // 3, longest], [6, 2])
    seen = []
    for r in range(2):
        ds = StreamingBatches(corpus.brace, 40 * longest, 16, window_samples=50, rank=r, world_size=2,
                              read_mode=read_mode, pack=pack, limit=curve)
        ds.set_epoch(1)
        for batch in ds:
            lens = [corpus.expected[x["__key__"]] for x in batch]
            top = max(lens)
            if len(lens) > 1:
                allowed = int(curve.max_batch_size(top))
                assert (-(-sum(lens) // top) if pack else len(lens)) <= allowed
            seen += [x["__key__"] for x in batch]
    assert set(seen) == set(corpus.expected)



def test_streaming_resumes_only_under_the_same_curve(make_corpus):
    corpus = make_corpus([40, 40], seed=4)
    longest = max(corpus.expected.values())

    def make(top):
        curve = LimitCurve.from_table([longest // 2, longest], [8, top])
        return StreamingBatches(corpus.brace, 40 * longest, 16, window_samples=30, rank=0, world_size=1,
                                limit=curve)

    ds = make(3)
    it = iter(ds)
    first = [x["__key__"] for x in next(it)]
    state = ds.state_dict()
    with pytest.raises(ValueError, match="other shards, sidecars or settings"):
        make(2).load_state_dict(state)
    same, ref = make(3), [[x["__key__"] for x in b] for b in make(3)]
    same.load_state_dict(state)
    assert [first] + [[x["__key__"] for x in b] for b in same] == ref

from streambatch.streaming import StreamingBatches  # noqa: E402  (after the planner tests: a heavier import)


def test_the_plan_command_plans_under_a_limit_file(tmp_path, capsys):
    from streambatch.cli.main import main

    lengths = np.random.default_rng(1).integers(10, 400, size=600)
    np.save(tmp_path / "lengths.npy", lengths)
    curve = LimitCurve.from_table([100, 250, 400], [30, 8, 2])
    curve.save(tmp_path / "limits.json")
    args = ["plan", str(tmp_path / "lengths.npy"), "-t", "8000", "--planner", "bucketed", "--json"]
    main(args)
    bare = json.loads(capsys.readouterr().out)
    main(args + ["--limit", str(tmp_path / "limits.json")])
    out = json.loads(capsys.readouterr().out)
    assert bare["limit_curve"] is None
    assert out["limit_curve"] == {"source": "table", "digest": curve.digest(), "batches_over": 0}
    assert out["fewest_steps"] > bare["fewest_steps"]
    assert main(["plan", str(tmp_path / "lengths.npy"), "-t", "8000", "--limit", str(tmp_path / "limits.json")])
    assert "planner='bucketed'" in capsys.readouterr().err
