"""One rank of the multi-process remote-streaming tests (started by
``torch.multiprocessing``): streams an epoch through 2 forked DataLoader
workers from a real server, then tries a dataset whose every shard GET fails
and records the error; writes ``OUT_DIR/rank{R}.json``."""

from __future__ import annotations

import json
import os

BUDGET, CAP, WINDOW = 400, 12, 60


def run_rank(rank: int, world: int, init_method: str, source: str, broken: str, options: dict | None,
             broken_options: dict | None, index_dir: str | None, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from streambatch.streaming import ShardError, StreamingBatches
    from streambatch.streaming.io.retry import RetryPolicy

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    result: dict = {"rank": rank}
    cache = os.path.join(out_dir, "cache")
    try:
        ds = StreamingBatches(source, BUDGET, CAP, window_samples=WINDOW, index_dir=index_dir,
                              storage_options=options, cache_dir=cache, prefetch_shards=2)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        result["epoch"] = [[s["__key__"] for s in b] for b in loader]
        result["len"] = len(ds)
        bad = StreamingBatches(broken, BUDGET, CAP, window_samples=WINDOW, index_dir=index_dir,
                               storage_options=broken_options, cache_dir=cache, verify=False,
                               retry=RetryPolicy(retries=2, backoff=0.01))
        try:
            for _ in DataLoader(bad, batch_size=None, num_workers=2, multiprocessing_context="fork"):
                pass
            result["error"] = ""
        except ShardError as exc:
            result["error"] = str(exc)
        except Exception as exc:  # the DataLoader re-raises a worker's error with its type when it can
            result["error"] = f"{type(exc).__name__}: {exc}"
        dist.barrier()  # a rank stuck on the broken shards would hang here, failing the test by timeout
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
