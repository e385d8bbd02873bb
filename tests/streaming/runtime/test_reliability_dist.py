"""Failures on one rank of a real 2-rank gloo group (127.0.0.1) must reach
every rank at once, with the same cause named, instead of a hang until the
process-group timeout (issue 11, item 6)."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.helpers import free_port, lognormal_lengths
from tests.support.shards import FPS

pytestmark = pytest.mark.slow  # real multi-process runs

WORLD = 2
TIMEOUT_S = 30  # gloo's own timeout for this test: a regression fails here instead of hanging for 30 min


def _attempt(results: dict, name: str, fn) -> None:
    t = time.perf_counter()
    try:
        fn()
        results[name] = {"ok": True}
    except Exception as exc:
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    results[name]["seconds"] = time.perf_counter() - t


def worker(rank: int, port: int, out_dir: str, pattern: str, broken: str) -> None:
    from streambatch import DynamicBatchSampler
    from streambatch.streaming import StreamingBatches

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    lengths = lognormal_lengths(500)
    res: dict = {}
    try:
        # an argument error on one rank, before the cross-rank check
        _attempt(res, "sampler_bad_budget",
                 lambda: DynamicBatchSampler(lengths, 0 if rank == 1 else 4000, 16, rank=None, world_size=None))
        _attempt(res, "stream_bad_budget",
                 lambda: StreamingBatches(pattern, 0 if rank == 1 else 400, 12, window_samples=90))
        # index_missing: rank 1's share of the shards cannot be indexed (a corrupt tar)
        _attempt(res, "index_missing_fails_on_one_rank",
                 lambda: StreamingBatches(broken, 400, 12, window_samples=90, index_missing=True,
                                          frames_per_second=FPS))
        # states from different epochs (or positions) loaded on the two ranks
        s = DynamicBatchSampler(lengths, 4000, 16, rank=None, world_size=None)
        saved = s.state_dict()
        _attempt(res, "sampler_states_of_different_epochs",
                 lambda: s.load_state_dict({**saved, "epoch": rank, "step": 0}))
        _attempt(res, "sampler_states_of_different_steps",
                 lambda: s.load_state_dict({**saved, "epoch": 0, "step": rank}))
        # set_epoch is a collective even when the epoch does not change: ranks
        # at different epochs that call set_epoch(3) agree and plan alike
        def set_epoch_from_different_epochs():
            s.set_epoch(3 if rank == 0 else 2)  # (each rank: a collective too, on its own epoch)

        _attempt(res, "set_epoch_different_epochs", set_epoch_from_different_epochs)

        def converge():
            s.set_epoch(3)
            res["plan_after"] = list(map(list, s))

        _attempt(res, "set_epoch_converges", converge)
        ds = StreamingBatches(pattern, 400, 12, window_samples=90)
        _attempt(res, "stream_states_of_different_epochs",
                 lambda: ds.load_state_dict({**ds.state_dict(), "epoch": rank, "step": 0}))
        _attempt(res, "still_in_step", lambda: dist.barrier())
    finally:
        Path(out_dir, f"{rank}.json").write_text(json.dumps(res))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def corpus(make_corpus, tmp_path_factory):
    good = make_corpus([30, 25, 28, 20], seed=2, name="reliability")
    pattern, paths = good.brace, good.paths
    broken = tmp_path_factory.mktemp("broken")
    copies = []
    for p in paths:
        q = broken / os.path.basename(p)
        shutil.copyfile(p, q)
        copies.append(str(q))
    from streambatch.streaming import sidecar_path
    from streambatch.streaming.shards.sidecar import read_arrays

    (offsets,) = read_arrays(sidecar_path(paths[1]), ("offsets",))
    with open(copies[1], "r+b") as f:  # shard 1 is indexed by rank 1 (shard i goes to rank i % 2)
        f.seek(int(offsets[3]) + 1)  # a damaged tar header
        f.write(b"\x00\xff\x13")
    return pattern, copies


@pytest.mark.timeout(240)
def test_one_rank_failing_raises_on_every_rank_at_once(corpus, tmp_path):
    os.environ.pop("MASTER_ADDR", None)
    t = time.perf_counter()
    mp.spawn(worker, args=(free_port(), str(tmp_path), corpus[0], corpus[1]), nprocs=WORLD, join=True)
    elapsed = time.perf_counter() - t
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD))
    for name in ("sampler_bad_budget", "stream_bad_budget", "index_missing_fails_on_one_rank",
                 "sampler_states_of_different_epochs", "sampler_states_of_different_steps",
                 "set_epoch_different_epochs", "stream_states_of_different_epochs"):
        assert "error" in r0[name] and "error" in r1[name], (name, r0[name], r1[name])
        assert max(r0[name]["seconds"], r1[name]["seconds"]) < TIMEOUT_S / 2, (name, r0[name], r1[name])
    # the failing rank raises its own error; the other names that rank and the same cause
    assert r1["sampler_bad_budget"]["error"].startswith("ValueError: max_batch_tokens must be >= 1")
    assert "rank 1 failed" in r0["sampler_bad_budget"]["error"]
    assert "max_batch_tokens must be >= 1" in r0["sampler_bad_budget"]["error"]
    assert "max_batch_tokens must be >= 1" in r0["stream_bad_budget"]["error"]
    assert "rank 1 failed" in r0["index_missing_fails_on_one_rank"]["error"]
    assert "ShardError" in r0["index_missing_fails_on_one_rank"]["error"]
    assert r1["index_missing_fails_on_one_rank"]["error"].startswith("ShardError")
    for r in (r0, r1):
        assert "has epoch" in r["sampler_states_of_different_epochs"]["error"]
        assert "has start batch" in r["sampler_states_of_different_steps"]["error"]
        assert "has epoch" in r["set_epoch_different_epochs"]["error"]
        assert "has epoch" in r["stream_states_of_different_epochs"]["error"]
        assert r["set_epoch_converges"] == {"ok": True, "seconds": r["set_epoch_converges"]["seconds"]}
        assert r["still_in_step"]["ok"]
    assert r0["plan_after"] != r1["plan_after"] and len(r0["plan_after"]) == len(r1["plan_after"])
    assert elapsed < 120
