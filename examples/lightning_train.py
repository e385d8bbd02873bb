"""PyTorch Lightning: DynamicBatchSampler (or StreamingBatches) under Trainer(strategy="ddp").

    pip install 'streambatch[integrations]'
    python examples/lightning_train.py                   # 2 CPU processes (Lightning starts the second)
    python examples/lightning_train.py --streaming

Build the sampler in setup() (torch.distributed is up by then), position it in train_dataloader()
with sync_with_trainer (the epoch, and after a restart the first batch not yet trained), and let
Lightning reload the loader every epoch, since the number of steps changes by epoch.
use_distributed_sampler=False stops Lightning from wrapping the sampler in a DistributedSampler.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import lightning as L
import torch
from torch.utils.data import DataLoader

from streambatch import DynamicBatchSampler, StreamingBatches, collate_audio, index_shards
from streambatch.integrations.lightning import sync_with_trainer

from common import Clips, TinyModel, clip_lengths, pad, write_shards


class MapStyle(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = TinyModel()
        self.lengths = clip_lengths(3000)

    def setup(self, stage):
        self.sampler = DynamicBatchSampler(self.lengths, 16_000, 64, rank=None, world_size=None, planner="bucketed")

    def train_dataloader(self):
        sync_with_trainer(self.sampler, self.trainer)
        return DataLoader(Clips(self.lengths), batch_sampler=self.sampler, collate_fn=pad, num_workers=2)

    def training_step(self, batch, batch_idx):
        return self.model(batch["x"], batch["mask"])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def on_train_epoch_end(self):
        print(f"rank {self.global_rank}: epoch {self.current_epoch}: {len(self.sampler)} steps")


class Streaming(MapStyle):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = pattern

    def setup(self, stage):
        self.sampler = StreamingBatches(self.pattern, 2_000, 32, decode="audio", collate_fn=collate_audio)

    def train_dataloader(self):
        sync_with_trainer(self.sampler, self.trainer)
        return DataLoader(self.sampler, batch_size=None, num_workers=2)  # Lightning leaves iterable datasets alone

    def training_step(self, batch, batch_idx):
        x = batch["audio"][:, : batch["audio"].shape[1] // 16 * 16].reshape(len(batch["keys"]), -1, 16)
        return self.model(x, torch.ones(x.shape[:2]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streaming", action="store_true")
    p.add_argument("--dir", help="where to write the shards for --streaming (default: a temporary directory)")
    args = p.parse_args()
    module: L.LightningModule = MapStyle()
    if args.streaming:
        # Lightning starts the second process by running this script again, with LOCAL_RANK set: the shards
        # are written by the first. A --dir both processes can name keeps them in one place.
        directory = args.dir or os.environ.setdefault("EXAMPLE_SHARDS", tempfile.mkdtemp(prefix="streambatch-"))
        pattern = os.path.join(directory, "train-{000000..000007}.tar")
        if "LOCAL_RANK" not in os.environ:
            write_shards(directory, shards=8, per_shard=40)
            index_shards(pattern, length_from="json:duration", frames_per_second=50, progress=False)
        module = Streaming(pattern)
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=2, use_distributed_sampler=False,
                        reload_dataloaders_every_n_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)


if __name__ == "__main__":
    main()
