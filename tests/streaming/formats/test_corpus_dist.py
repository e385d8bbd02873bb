"""Corpus formats under real torch.distributed: 3 gloo ranks on 127.0.0.1,
each with 2 DataLoader workers, stream one dataset mixing a Lhotse Shar, a
NeMo tarred and a Parquet corpus; every sample once per epoch, equal steps,
the same batches as a single process plans; a rank that opens the corpora
with another frame rate makes every rank raise (none hangs)."""

from __future__ import annotations

import collections
import json
import os

import pytest
import torch.multiprocessing as mp

from streambatch.streaming import Source, StreamingBatches
from tests.support.corpora import FPS, write_nemo, write_parquet, write_shar
from tests.support.helpers import free_port

pytestmark = pytest.mark.slow  # real multi-process runs

BUDGET, CAP, WINDOW = 600, 10, 60


def sources(root: str) -> list[Source]:
    return [Source(os.path.join(root, "shar"), name="shar"),
            Source(os.path.join(root, "nemo", "tarred_audio_manifest.json"), name="nemo"),
            Source(os.path.join(root, "pq", "*.parquet"), name="parquet")]


def _rank(rank: int, world: int, init_method: str, root: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    result: dict = {"rank": dist.get_rank(), "epochs": []}
    try:
        try:  # one rank plans at another frame rate: all must raise together
            StreamingBatches(sources(root), BUDGET, CAP, window_samples=WINDOW,
                             frames_per_second=FPS * (2 if rank == 1 else 1))
        except ValueError as exc:
            result["mismatch"] = str(exc)
        ds = StreamingBatches(sources(root), BUDGET, CAP, window_samples=WINDOW, frames_per_second=FPS)
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True,
                            multiprocessing_context="fork")
        for e in range(2):
            ds.set_epoch(e)
            result["epochs"].append([[s["__key__"] for s in b] for b in loader])
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()


def test_three_gloo_ranks_mix_three_formats(tmp_path):
    root = str(tmp_path / "corpora")
    _, shar = write_shar(os.path.join(root, "shar"), 40, shard_size=10, seed=31)
    _, nemo = write_nemo(os.path.join(root, "nemo"), 35, num_shards=3, seed=32)
    _, pq = write_parquet(os.path.join(root, "pq"), 45, files=3, rows_per_group=8, seed=33, writer="pyarrow")
    expected = set(shar) | set(nemo) | set(pq)
    world, port = 3, free_port()
    mp.start_processes(_rank, args=(world, f"tcp://127.0.0.1:{port}", root, str(tmp_path)), nprocs=world,
                       join=True, start_method="spawn")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert all("differs across ranks" in r.get("mismatch", "") for r in results)
    for e in range(2):
        assert len({len(r["epochs"][e]) for r in results}) == 1  # equal steps
        counts = collections.Counter(k for r in results for b in r["epochs"][e] for k in b)
        assert set(counts) == expected and sum(counts.values()) - len(expected) < world
        for r in results:  # the batches one process plans for that rank, workers and launch aside
            ds = StreamingBatches(sources(root), BUDGET, CAP, window_samples=WINDOW, frames_per_second=FPS,
                                  rank=r["rank"], world_size=world)
            ds.set_epoch(e)
            assert r["epochs"][e] == [[s["__key__"] for s in b] for b in ds]
