"""Shard mode across real processes: 4 gloo ranks x 2 DataLoader workers."""

from __future__ import annotations

import collections
import json
import os

import pytest
import torch.multiprocessing as mp

from streambatch.epoch.read_modes import iter_windows
from streambatch.streaming import StreamingBatches
from tests.support.corpus import index_corpus
from tests.support.helpers import free_port
from tests.support.shards import write_corpus

pytestmark = pytest.mark.slow  # real multi-process runs

BUDGET, CAP, WINDOW, WORLD = 400, 12, 120, 4


def _rank(rank, world, init_method, pattern, out_dir):
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        ds = StreamingBatches(pattern, BUDGET, CAP, window_samples=WINDOW, read_mode="shard")
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True,
                            multiprocessing_context="fork")
        epochs = []
        for e in range(2):
            ds.set_epoch(e)
            epochs.append([[s["__key__"] for s in b] for b in loader])
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": ds.rank, "len": len(ds), "epochs": epochs}, f)


def test_shard_mode_four_gloo_ranks_two_workers(tmp_path):
    brace, _, expected = write_corpus(tmp_path / "data", [31, 27, 0, 40, 22, 35, 29, 18, 33, 26, 30], seed=17)
    index_corpus(brace)
    port = free_port()
    mp.start_processes(_rank, args=(WORLD, f"tcp://127.0.0.1:{port}", brace, str(tmp_path)), nprocs=WORLD,
                       join=True, start_method="spawn")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [r["rank"] for r in results] == list(range(WORLD))
    for e in range(2):
        assert len({len(r["epochs"][e]) for r in results}) == 1
        counts = collections.Counter(k for r in results for b in r["epochs"][e] for k in b)
        assert set(counts) == set(expected) and sum(counts.values()) - len(expected) < WORLD
        for r in results:  # each rank trained only on what its plan lets it read, as a single process would
            ds = StreamingBatches(brace, BUDGET, CAP, window_samples=WINDOW, read_mode="shard", rank=r["rank"],
                                  world_size=WORLD)
            ds.set_epoch(e)
            assert r["epochs"][e] == [[s["__key__"] for s in b] for b in ds]
            cat = ds.catalog
            allowed = set()
            for win in iter_windows(cat.counts, cat.lengths, ds.config, e):
                for rr, s, lo, hi in win.reads.tolist():
                    if rr == r["rank"]:
                        allowed |= {k.decode() for k in cat.table(s)[0][lo:hi]}
                allowed |= {cat.table(int(win.shard_ids[i]))[0][win.local[i]].decode()
                            for i in range(win.n_carried) if win.holder[i] == r["rank"]}
            assert {k for b in r["epochs"][e] for k in b} <= allowed
    assert results[0]["epochs"][0] != results[0]["epochs"][1]
