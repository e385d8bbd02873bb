"""Real multi-process runs: 4 ranks with torch.distributed (gloo on 127.0.0.1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from tests.support.helpers import Echo, free_port

pytestmark = pytest.mark.slow  # real multi-process runs

WORLD = 4


def lengths_for(rank: int, mismatch: bool) -> np.ndarray:
    rs = np.random.default_rng(0)
    lengths = np.ceil(np.clip(rs.lognormal(np.log(5), 0.8, 5003), 0.5, 30) * 50).astype(np.int64)
    if mismatch and rank == WORLD - 1:
        lengths[17] += 1  # one rank read a slightly different manifest
    return lengths


def worker(rank: int, port: int, out_dir: str, mismatch: bool) -> None:
    from streambatch import DynamicBatchSampler

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    result: dict = {}
    try:
        sampler = DynamicBatchSampler(lengths_for(rank, mismatch), 6000, 32, rank=None, world_size=None, seed=5)
        loader = DataLoader(Echo(), batch_sampler=sampler, num_workers=2, collate_fn=list)
        epochs, lens, padded = [], [], []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            epochs.append([list(map(int, b)) for b in loader])
            lens.append(len(sampler))
            padded.append(sampler.num_padded)
        result = {"epochs": epochs, "len": lens, "padded": padded}
    except ValueError as exc:
        result = {"error": str(exc)}
    finally:
        Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()


def run(tmp_path: Path, mismatch: bool) -> list[dict]:
    os.environ.pop("MASTER_ADDR", None)
    mp.spawn(worker, args=(free_port(), str(tmp_path), mismatch), nprocs=WORLD, join=True)
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.timeout(300)
def test_four_ranks_equal_steps_and_full_coverage(tmp_path):
    results = run(tmp_path, mismatch=False)
    n = len(lengths_for(0, False))
    for epoch in range(2):
        steps = [len(r["epochs"][epoch]) for r in results]
        assert len(set(steps)) == 1 and steps[0] == results[0]["len"][epoch] > 0
        seen = [i for r in results for batch in r["epochs"][epoch] for i in batch]
        assert set(seen) == set(range(n))  # every sample, on some rank
        assert len(seen) - n == results[0]["padded"][epoch] <= WORLD - 1  # repeats only the documented padding
    assert results[0]["epochs"][0] != results[0]["epochs"][1]


@pytest.mark.timeout(300)
def test_mismatched_lengths_raise_on_every_rank_instead_of_hanging(tmp_path):
    results = run(tmp_path, mismatch=True)
    for r in results:
        assert "differs across ranks" in r.get("error", ""), r
