"""One rank of the multi-process streaming tests.

Run by ``torch.multiprocessing`` (``run_rank`` with a tcp:// init method) or
as a script by ``torchrun`` (env:// rendezvous): ``launch_torchrun.py
PATTERN OUT_DIR``. Each rank writes the keys of every batch it received, per
epoch, to ``OUT_DIR/rank{R}.json`` for the test to check.
"""

from __future__ import annotations

import json
import os
import sys

BUDGET, CAP, WINDOW = 400, 12, 90


def run_rank(rank: int, world: int, init_method: str, pattern: str, out_dir: str, epochs: int = 2,
             num_workers: int = 2, mismatch_rank: int | None = None) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from streambatch.streaming import StreamingBatches

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    rank = dist.get_rank()
    result: dict = {"rank": rank, "world": dist.get_world_size(), "epochs": []}
    try:
        if mismatch_rank is not None:
            # one rank with another seed: every rank must raise, none may hang
            try:
                StreamingBatches(pattern, BUDGET, CAP, window_samples=WINDOW, seed=7 if rank == mismatch_rank else 42)
            except ValueError as exc:
                result["mismatch"] = str(exc)
            # one rank cannot find its sidecars: it raises that, the others a mismatch
            try:
                StreamingBatches(pattern, BUDGET, CAP, window_samples=WINDOW,
                                 index_dir=os.path.join(out_dir, "nowhere") if rank == mismatch_rank else None)
            except (ValueError, FileNotFoundError) as exc:
                result["missing"] = f"{type(exc).__name__}: {exc}"
        ds = StreamingBatches(pattern, BUDGET, CAP, window_samples=WINDOW)  # rank/world from torch.distributed
        # fork workers: a process started by spawn would otherwise spawn its
        # DataLoader workers too, re-importing torch in each (slow on 2 cores);
        # spawn-started workers are covered in test_streaming.py.
        loader = DataLoader(ds, batch_size=None, num_workers=num_workers, persistent_workers=num_workers > 0,
                            multiprocessing_context="fork" if num_workers > 0 else None)
        for e in range(epochs):
            ds.set_epoch(e)
            result["epochs"].append([[s["__key__"] for s in b] for b in loader])
        result["len"] = len(ds)
        result["ds_rank"], result["ds_world"] = ds.rank, ds.world_size
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", sys.argv[1], sys.argv[2])
