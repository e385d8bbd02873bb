"""Elastic resume: a job stopped at one world size finishes the epoch at another, nothing lost or repeated.

    pip install torchdata                       # StatefulDataLoader (in the integrations extra)
    torchrun --nproc-per-node 3 examples/elastic_resume.py --checkpoint ckpt.pt --stop-after 4
    torchrun --nproc-per-node 2 examples/elastic_resume.py --checkpoint ckpt.pt      # 3 -> 2 ranks
    # the same with --streaming: StreamingBatches over generated shards (in --dir)

The code is that of an ordinary resume; only the number of processes changes. The loader's state
(rank 0's: no value in it depends on the rank) says how many global steps of the epoch were done
at which world size; loading it at another world size plans the rest of the epoch for the new
world, deterministically, on every rank. --record DIR writes what each rank trained, so that a
test can check every sample was trained once.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from streambatch import DynamicBatchSampler, StreamingBatches, index_shards

from common import Clips, clip_lengths, pad, write_shards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="saved at --stop-after; resumed from when it exists")
    p.add_argument("--stop-after", type=int, help="save after this many steps of epoch 0 and exit")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--streaming", action="store_true", help="StreamingBatches over shards in --dir")
    p.add_argument("--dir", default="elastic-shards", help="--streaming: the shards (written if missing)")
    p.add_argument("--record", help="write the trained sample ids of each rank to this directory")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    if args.streaming:
        pattern = os.path.join(args.dir, "train-{000000..000007}.tar")
        if rank == 0 and not os.path.exists(os.path.join(args.dir, "train-000007.tar.idx.npz")):
            write_shards(args.dir, shards=8, per_shard=40)
            index_shards(pattern, length_from="json:duration", frames_per_second=50, progress=False)
        dist.barrier()
        batches = ds = StreamingBatches(pattern, 2_000, 16, window_samples=160)  # rank/world from torch.distributed
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    else:
        lengths = clip_lengths(2000)
        batches = sampler = DynamicBatchSampler(lengths, 16_000, 64, rank=None, world_size=None, planner="bucketed")
        loader = StatefulDataLoader(Clips(lengths), batch_sampler=sampler, num_workers=2, collate_fn=pad)

    start_epoch = 0
    resumed = os.path.exists(args.checkpoint)
    if resumed:
        ckpt = torch.load(args.checkpoint, weights_only=False)  # rank 0's checkpoint, on every rank of the new job
        if args.streaming:
            ds.load_state_dict(ckpt["loader"])  # tells the main process where the old job stopped
        loader.load_state_dict(ckpt["loader"])  # (optional for streaming; the sampler needs just this)
        start_epoch = ckpt["epoch"]
        print(f"rank {rank} of {world}: resuming epoch {start_epoch} after {ckpt['steps']} steps at "
              f"world size {ckpt['world_size']}")

    trained: list = []
    for epoch in range(start_epoch, args.epochs):
        batches.set_epoch(epoch)  # the saved epoch again: keeps the resume
        for step, batch in enumerate(loader, 1):
            ids = [s["__key__"] for s in batch] if args.streaming else batch["index"].tolist()
            trained.extend(ids)  # ... a training step on the batch ...
            if epoch == 0 and step == args.stop_after and not resumed:  # say, a preemption signal arrived
                if rank == 0:
                    torch.save({"epoch": epoch, "loader": loader.state_dict(), "steps": step, "world_size": world},
                               args.checkpoint)
                print(f"rank {rank} of {world}: stopped after {step} steps of epoch {epoch}")
                finish(args, rank, trained, resumed)
                return
        print(f"rank {rank} of {world}: epoch {epoch}: {len(batches)} steps in all (at every world size)")
    finish(args, rank, trained, resumed)


def finish(args, rank: int, trained: list, resumed: bool) -> None:
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        with open(os.path.join(args.record, f"{'second' if resumed else 'first'}-rank{rank}.json"), "w") as f:
            json.dump(trained, f)
    dist.barrier()  # rank 0's checkpoint is written before any process exits
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
