"""Shared pieces of the trainer-integration tests (accelerate, HF Trainer,
Lightning): the corpus, the plain-DDP reference batches, and the checks that
a (possibly interrupted and resumed) run trained every sample once per epoch,
with equal steps on every rank and the batches of the plain DDP loop."""

from __future__ import annotations

import collections
import json
import os

from tests.support.helpers import lognormal_lengths

WORLD = 2
N, BUDGET, CAP = 600, 3000, 16


def lengths():
    return lognormal_lengths(N, seed=3)


def rank_env(rank: int, port: int, world: int = WORLD) -> None:
    """The environment torchrun would give rank ``rank`` (accelerate and the
    HF Trainer start torch.distributed from it)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")


def plain_ddp(epochs: int, planner: str = "greedy", world: int = WORLD) -> list[list[list[list[int]]]]:
    """[rank][epoch] -> the batches DynamicBatchSampler(rank=r) yields in a plain DDP loop."""
    from streambatch import DynamicBatchSampler

    out = []
    for r in range(world):
        s = DynamicBatchSampler(lengths(), BUDGET, CAP, rank=r, world_size=world, planner=planner)
        per_epoch = []
        for e in range(epochs):
            s.set_epoch(e)
            per_epoch.append(list(s))
        out.append(per_epoch)
    return out


def check_epoch(per_rank: list[list[list[int]]], n: int = N, world: int = WORLD) -> None:
    """One epoch as trained by each rank: equal steps, every sample, repeats
    only the final step's padding (< world_size)."""
    steps = {len(b) for b in per_rank}
    assert len(steps) == 1, f"ranks took different step counts {steps}"
    counts = collections.Counter(i for batches in per_rank for b in batches for i in b)
    assert set(counts) == set(range(n)), f"{n - len(counts)} samples never trained"
    assert sum(counts.values()) - n < world


def read_ranks(out_dir, name: str = "rank{r}.json", world: int = WORLD) -> list:
    results = []
    for r in range(world):
        with open(os.path.join(out_dir, name.format(r=r))) as f:
            results.append(json.load(f))
    return results


def write_json(path, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f)
