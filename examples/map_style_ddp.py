"""Map-style data under DDP: DynamicBatchSampler in a plain training loop, launched by torchrun.

    torchrun --nproc-per-node 2 examples/map_style_ddp.py
    torchrun --nproc-per-node 2 examples/map_style_ddp.py --checkpoint ckpt.pt --stop-after 5   # "preempted"
    torchrun --nproc-per-node 2 examples/map_style_ddp.py --checkpoint ckpt.pt                  # resumes

Every process plans the same global steps from the same lengths and takes its own batch of
each: equal steps on every rank, every clip once per epoch (up to world_size - 1 clips of the
final step repeated, `sampler.num_padded`). A checkpoint holds the epoch and the steps done in
it; resuming skips them without reading their data. Runs on CPUs (gloo) or GPUs (nccl).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from streambatch import DynamicBatchSampler

from common import Clips, TinyModel, clip_lengths, pad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    p.add_argument("--checkpoint", help="save here at --stop-after, resume from here when it exists")
    p.add_argument("--stop-after", type=int, help="save the checkpoint after this many steps and exit")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun's environment says where and who
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")

    lengths = clip_lengths(args.samples)  # yours: one length per sample (frames, tokens), in dataset order
    sampler = DynamicBatchSampler(lengths, max_batch_tokens=16_000, max_batch_size=64,
                                  rank=None, world_size=None,  # from torch.distributed
                                  planner="bucketed")
    loader = DataLoader(Clips(lengths), batch_sampler=sampler, collate_fn=pad, num_workers=args.workers)
    model = DistributedDataParallel(TinyModel().to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    start_epoch, start_step = 0, 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, weights_only=True)  # rank 0's checkpoint, read on every rank
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch, start_step = ckpt["epoch"], ckpt["step"]
        print(f"rank {rank}: resuming at epoch {start_epoch}, step {start_step}")

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # on every rank: it checks that all ranks plan the same steps
        step = start_step if epoch == start_epoch else 0
        sampler.set_start_batch(step)  # skip the steps a checkpoint says were done
        clips = 0
        for batch in loader:
            loss = model(batch["x"].to(device), batch["mask"].to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            clips += len(batch["index"])
            if step == args.stop_after:
                if rank == 0 and args.checkpoint:
                    torch.save({"epoch": epoch, "step": step, "model": model.module.state_dict(),
                                "optimizer": optimizer.state_dict()}, args.checkpoint)
                print(f"rank {rank}: stopped at epoch {epoch}, step {step}")
                dist.barrier()  # the checkpoint is written before any rank exits
                dist.destroy_process_group()
                return
        print(f"rank {rank}: epoch {epoch}: {step} of {len(sampler)} steps, {clips} clips, loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
