"""accelerate: DynamicBatchSampler through accelerator.prepare, and StreamingBatches beside it.

    pip install 'streambatch[integrations]'
    torchrun --nproc-per-node 2 examples/accelerate_train.py     # on GPUs: accelerate launch --num_processes 2 ...
    torchrun --nproc-per-node 2 examples/accelerate_train.py --streaming

A DynamicBatchSampler already yields one rank's batches, and prepare() deals a loader's batches out
to the processes again; GlobalBatchSampler yields every rank's batch of each step in rank order,
so accelerate's dealing gives process r exactly rank r's batches. StreamingBatches already yields
this process's batches: iterate it without prepare(), moving batches to the device yourself.
With --state DIR, --stop-after N saves the state after N steps and exits (a preempted job); the
same command without --stop-after resumes from DIR:

    torchrun --nproc-per-node 2 examples/accelerate_train.py --state ckpt --stop-after 5
    torchrun --nproc-per-node 2 examples/accelerate_train.py --state ckpt
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from streambatch import DynamicBatchSampler, StreamingBatches, collate_audio, index_shards
from streambatch.integrations import GlobalBatchSampler

from common import Clips, TinyModel, clip_lengths, pad, write_shards


def train_map_style(accelerator: Accelerator, args: argparse.Namespace) -> None:
    lengths = clip_lengths(3000)
    sampler = DynamicBatchSampler(lengths, 16_000, 64, rank=None, world_size=None,  # planned for all processes
                                  planner="bucketed")
    loader = DataLoader(Clips(lengths), batch_sampler=GlobalBatchSampler(sampler), collate_fn=pad, num_workers=2)
    model = TinyModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    start_epoch, start_step = 0, 0
    position = os.path.join(args.state, "position.json")
    if os.path.exists(position):  # a restarted job: model, optimizer and RNG states, then our position
        accelerator.load_state(args.state)
        with open(position) as f:
            start_epoch, start_step = json.load(f)
        accelerator.print(f"resuming at epoch {start_epoch}, step {start_step}")
    for epoch in range(start_epoch, 2):
        sampler.set_epoch(epoch)  # the sampler's, as in plain DDP (not loader.set_epoch)
        batches = accelerator.skip_first_batches(loader, start_step) if epoch == start_epoch else loader
        step = start_step if epoch == start_epoch else 0
        for batch in batches:
            loss = model(batch["x"], batch["mask"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == args.stop_after:
                accelerator.save_state(args.state)
                if accelerator.is_main_process:
                    with open(position, "w") as f:
                        json.dump([epoch, step], f)
                accelerator.print(f"saved the state at epoch {epoch}, step {step}")
                return
        accelerator.print(f"epoch {epoch}: {step} steps per process (len(loader) = {len(loader)})")


def train_streaming(accelerator: Accelerator, args: argparse.Namespace) -> None:
    from accelerate.utils import send_to_device
    from torchdata.stateful_dataloader import StatefulDataLoader

    shards = os.path.join(args.state, "shards")
    pattern = os.path.join(shards, "train-{000000..000007}.tar")
    if accelerator.is_main_process:
        write_shards(shards, shards=8, per_shard=40)
        index_shards(pattern, length_from="json:duration", frames_per_second=50, progress=False)
    accelerator.wait_for_everyone()
    ds = StreamingBatches(pattern, 2_000, 32, decode="audio", collate_fn=collate_audio)  # rank/world: torch.distributed
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    accelerator.register_for_checkpointing(loader)  # save_state/load_state carry its position
    model = TinyModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)  # the model, not the streaming loader
    for epoch in range(2):
        ds.set_epoch(epoch)
        for batch in loader:
            batch = send_to_device(batch, accelerator.device)
            x = batch["audio"][:, : batch["audio"].shape[1] // 16 * 16].reshape(len(batch["keys"]), -1, 16)
            loss = model(x, torch.ones(x.shape[:2], device=x.device))
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(f"epoch {epoch}: {len(ds)} steps per process")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streaming", action="store_true", help="StreamingBatches over generated shards")
    p.add_argument("--stop-after", type=int, help="map-style: save the state to --state after this many steps, exit")
    p.add_argument("--state", help="checkpoint directory (default: a temporary one)")
    args = p.parse_args()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # starts torch.distributed under a launcher
    if args.state is None:  # one directory for every process
        made = [tempfile.mkdtemp(prefix="streambatch-accelerate-") if accelerator.is_main_process else None]
        if accelerator.num_processes > 1:
            torch.distributed.broadcast_object_list(made)
        args.state = made[0]
    (train_streaming if args.streaming else train_map_style)(accelerator, args)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
