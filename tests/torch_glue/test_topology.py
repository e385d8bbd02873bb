"""Topology agreement (issue 32, items 1-4): whenever torch.distributed is initialised, a rank or world size that
disagrees with it raises on every rank at construction, instead of training some samples twice and others never.

Real processes (torch.multiprocessing, gloo on 127.0.0.1), each running the same scenarios in the same order
(each construction is a collective), recording what it saw:

1. ``DynamicBatchSampler`` with its seed-compatible defaults (``rank=0, world_size=1``) under a group of 2 warns,
   once per process, naming ``rank=None, world_size=None`` (it used to train all samples on both ranks);
2. ``DynamicBatchSampler(world_size=2)`` with ``rank=0`` on both: both raise (107 samples twice, 93 never);
3. ``StreamingBatches(world_size=4)`` in a 2-process job: both raise (96 of 200 never, a 60 s stall per epoch);
4. ``StreamingBatches(rank=0, world_size=2)`` on both: both raise (the agreement did not include the rank);
5. lhotse's ``BalancedCutSampler`` (a ``DynamicBatchSampler``) with ``rank=0, world_size=2`` on both: both raise.

The layouts that are right still build: ``None`` (from torch.distributed), explicit ranks that are a permutation,
``world_size=1`` (one process alone, e.g. evaluation), and in a 4-process group a data-parallel world of 2 whose
ranks are each claimed by 2 processes (tensor parallelism: they share their batches).
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.helpers import free_port

pytestmark = pytest.mark.slow  # real multi-process runs

LENGTHS = np.random.default_rng(0).integers(20, 600, 200)


def _attempt(fn) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = {"ok": fn()}
        except (ValueError, TypeError) as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return out


def cut_sampler(**kw):
    """lhotse's BalancedCutSampler over 120 cuts without audio (lhotse's own dummies)."""
    import lhotse
    from lhotse.testing.dummies import dummy_cut

    from streambatch.integrations.lhotse import BalancedCutSampler

    cuts = lhotse.CutSet.from_cuts(dummy_cut(i, duration=0.5 + (i % 9) / 4) for i in range(120))
    return BalancedCutSampler(cuts, max_duration=8.0, **kw)


def two_ranks(rank: int, port: int, out_dir: str, pattern: str) -> None:
    from streambatch import DynamicBatchSampler
    from streambatch.streaming import StreamingBatches

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    other = 1 - rank
    got = {}
    try:
        got["defaults"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16)))
        got["defaults_again"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, seed=3)))
        got["explicit_alone"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, True, False, 0, 1)))
        got["sampler_rank0_both"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, rank=0, world_size=2)))
        got["sampler_world4"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, rank=rank, world_size=4)))
        got["sampler_none"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, rank=None, world_size=None)))
        got["sampler_swapped"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, rank=other,
                                                                          world_size=2)))
        got["stream_world4"] = _attempt(lambda: len(StreamingBatches(pattern, 400, 8, world_size=4)))
        got["stream_rank0_both"] = _attempt(lambda: len(StreamingBatches(pattern, 400, 8, rank=0, world_size=2)))
        got["stream_none"] = _attempt(lambda: len(StreamingBatches(pattern, 400, 8)))
        if importlib.util.find_spec("lhotse") is not None:  # the same on every process: the same collectives
            got["lhotse_rank0_both"] = _attempt(lambda: len(cut_sampler(rank=0, world_size=2)))
            got["lhotse_none"] = _attempt(lambda: len(cut_sampler()))
        dist.barrier()
    finally:
        Path(out_dir, f"{rank}.json").write_text(json.dumps(got))
        dist.destroy_process_group()


def four_ranks(rank: int, port: int, out_dir: str) -> None:
    from streambatch import DynamicBatchSampler

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    got = {}
    try:
        # tensor parallelism of 2: processes 0, 1 are data-parallel rank 0; 2, 3 rank 1
        got["tp2"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, rank=rank // 2, world_size=2)))
        got["tp_uneven"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, rank=min(rank, 1) if rank < 3
                                                                    else 1, world_size=2)))
        got["world3"] = _attempt(lambda: len(DynamicBatchSampler(LENGTHS, 4000, 16, rank=rank % 3, world_size=3)))
        dist.barrier()
    finally:
        Path(out_dir, f"{rank}.json").write_text(json.dumps(got))
        dist.destroy_process_group()


def spawn(fn, world: int, tmp_path: Path, *args) -> list[dict]:
    os.environ.pop("MASTER_ADDR", None)
    out = tmp_path / "out"
    out.mkdir()
    mp.spawn(fn, args=(free_port(), str(out), *args), nprocs=world, join=True)
    return [json.loads((out / f"{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def two(make_corpus, tmp_path_factory):
    corpus = make_corpus([50, 50, 50, 50], seed=3, name="topo")
    return spawn(two_ranks, 2, tmp_path_factory.mktemp("topo-out"), corpus.brace)


@pytest.mark.timeout(300)
def test_seed_defaults_under_a_group_warn_once_naming_the_fix(two):
    for r in two:
        said = r["defaults"]["warnings"]
        assert "ok" in r["defaults"] and len(said) == 1, r["defaults"]
        assert "rank=None, world_size=None" in said[0] and "2 processes" in said[0]
        assert r["defaults_again"]["warnings"] == []  # once per process
        assert r["explicit_alone"] == {"ok": r["defaults"]["ok"], "warnings": []}  # world_size=1 given: meant


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case, words", [
    ("sampler_rank0_both", ["rank 0", "processes 0 and 1", "rank 1", "rank=None, world_size=None"]),
    ("sampler_world4", ["world_size=4", "2 processes", "rank=None, world_size=None"]),
    ("stream_world4", ["world_size=4", "2 processes", "rank=None, world_size=None"]),
    ("stream_rank0_both", ["rank 0", "processes 0 and 1", "rank=None, world_size=None"]),
    ("lhotse_rank0_both", ["rank 0", "processes 0 and 1", "rank=None, world_size=None"]),
])
def test_a_layout_that_disagrees_raises_on_every_rank(two, case, words):
    if case not in two[0]:
        pytest.skip("lhotse is not installed")
    for r in two:
        err = r[case].get("error", "")
        assert err.startswith("ValueError"), r[case]
        for w in words:
            assert w in err, (w, err)
    assert two[0][case]["error"] == two[1][case]["error"]  # the same verdict on every rank


@pytest.mark.timeout(300)
def test_layouts_that_agree_still_build(two):
    for case in ("sampler_none", "sampler_swapped", "stream_none", "lhotse_none"):
        if case not in two[0]:
            continue  # (lhotse not installed)
        assert [r[case].get("ok") for r in two][0] is not None, [r[case] for r in two]
        assert len({r[case]["ok"] for r in two}) == 1  # equal steps
        assert all(r[case]["warnings"] == [] for r in two)


@pytest.mark.timeout(300)
def test_data_parallel_ranks_shared_by_tensor_parallel_processes(tmp_path):
    four = spawn(four_ranks, 4, tmp_path)
    assert all("ok" in r["tp2"] for r in four), [r["tp2"] for r in four]
    for case, words in (("tp_uneven", ["rank 0", "rank 1", "2 processes each"]), ("world3", ["world_size=3"])):
        errors = {r[case].get("error", "") for r in four}
        assert len(errors) == 1, errors
        err = errors.pop()
        assert err.startswith("ValueError") and all(w in err for w in words), err
