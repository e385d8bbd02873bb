"""The Hugging Face Trainer: DynamicBatchTrainer trains on a DynamicBatchSampler's batches.

    pip install 'streambatch[integrations]'
    python examples/hf_trainer.py --out run                     # one process
    torchrun --nproc-per-node 2 examples/hf_trainer.py --out run
    torchrun --nproc-per-node 2 examples/hf_trainer.py --out run --resume   # from run's last checkpoint

The Trainer sizes its own DataLoader by per_device_train_batch_size; DynamicBatchTrainer takes the
sampler instead. Planned epochs differ by a few steps and the Trainer assumes they do not, so it
trains on the planned epochs laid end to end, cut into Trainer epochs of the length of epoch 0
(every planned epoch whole, each sample once). resume_from_checkpoint skips exactly the batches
already trained.
"""

from __future__ import annotations

import argparse
import gc
import glob
import os

import torch
from transformers import TrainingArguments

from streambatch import DynamicBatchSampler
from streambatch.integrations.hf import DynamicBatchTrainer

from common import Clips, TinyModel, clip_lengths, pad


class Model(TinyModel):
    """The Trainer wants a dict with the loss."""

    def forward(self, x, mask, **_):
        return {"loss": super().forward(x, mask)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="hf-run", help="the Trainer's output_dir (checkpoints)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps (-1: all epochs)")
    p.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --out")
    args = p.parse_args()

    cpu = not torch.cuda.is_available()
    training = TrainingArguments(  # starts torch.distributed under torchrun
        args.out, num_train_epochs=args.epochs, max_steps=args.max_steps, learning_rate=1e-3,
        save_strategy="steps", save_steps=10, logging_steps=10, report_to=[], disable_tqdm=True,
        use_cpu=cpu, ddp_backend="gloo" if cpu else None, dataloader_num_workers=2)
    lengths = clip_lengths(3000)
    sampler = DynamicBatchSampler(lengths, 16_000, 64, rank=None, world_size=None, planner="bucketed")
    trainer = DynamicBatchTrainer(model=Model(), args=training, train_dataset=Clips(lengths), data_collator=pad,
                                  train_batch_sampler=sampler)
    last = None
    if args.resume:
        found = sorted(glob.glob(os.path.join(args.out, "checkpoint-*")), key=lambda d: int(d.rsplit("-", 1)[1]))
        last = found[-1] if found else None
    result = trainer.train(resume_from_checkpoint=last)
    if trainer.is_world_process_zero():
        print(f"trained {result.global_step} optimizer steps of {trainer.train_batches.steps} batches per epoch"
              + (f", resumed from {last}" if last else ""))
    # Free the trainer while every rank's process group is still alive: its DDP-wrapped model holds the group, and
    # freeing it only when main() returns, after the group is destroyed, could leave a rank waiting at exit.
    del trainer
    gc.collect()
    if torch.distributed.is_initialized():  # a clean exit: gloo aborts a process that exits with its group alive
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
