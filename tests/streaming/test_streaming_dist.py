"""Multi-process StreamingBatches: 4 gloo ranks x 2 DataLoader workers via
torch.multiprocessing, and 2 nodes x 2 processes via two torchrun calls."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest
import torch.multiprocessing as mp

from streambatch.streaming import StreamingBatches
from tests.support.helpers import ROOT, SUPPORT, free_port
from tests.support.launch_torchrun import BUDGET, CAP, WINDOW, run_rank

pytestmark = pytest.mark.slow  # real multi-process runs



@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus([31, 27, 0, 40, 22, 35, 29, 18, 33], seed=13, name="dist")
    return c.brace, c.expected


def check_runs(out_dir, world, corpus, epochs=2):
    brace, expected = corpus
    results = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            results.append(json.load(f))
    assert [r["ds_rank"] for r in results] == list(range(world))
    assert all(r["ds_world"] == world for r in results)
    for e in range(epochs):
        steps = {len(r["epochs"][e]) for r in results}
        assert len(steps) == 1, f"epoch {e}: ranks took different step counts {steps}"
        counts = collections.Counter(k for r in results for b in r["epochs"][e] for k in b)
        assert set(counts) == set(expected) and sum(counts.values()) - len(expected) < world
        # identical to the single-process plan of each rank (no dependence on workers or launch)
        for r in results:
            ds = StreamingBatches(brace, BUDGET, CAP, window_samples=WINDOW, rank=r["rank"], world_size=world)
            ds.set_epoch(e)
            assert r["epochs"][e] == [[s["__key__"] for s in b] for b in ds]
    assert results[0]["epochs"][0] != results[0]["epochs"][1]
    return results


def test_four_gloo_ranks_two_workers(corpus, tmp_path):
    port = free_port()
    mp.start_processes(_spawned, args=(4, f"tcp://127.0.0.1:{port}", corpus[0], str(tmp_path)), nprocs=4,
                       join=True, start_method="spawn")
    results = check_runs(tmp_path, 4, corpus)
    assert all("differs across ranks" in r["mismatch"] for r in results)
    for r in results:
        want = "FileNotFoundError: 9 of 9 shards have no usable sidecar" if r["rank"] == 2 else "differs across ranks"
        assert want in r["missing"], r["missing"]


def _spawned(rank, world, init_method, pattern, out_dir):
    run_rank(rank, world, init_method, pattern, out_dir, num_workers=2, mismatch_rank=2)


def test_two_nodes_by_torchrun(corpus, tmp_path):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    procs = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                          "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                          os.path.join(SUPPORT, "launch_torchrun.py"), corpus[0], str(tmp_path)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=180)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    check_runs(tmp_path, 4, corpus)
