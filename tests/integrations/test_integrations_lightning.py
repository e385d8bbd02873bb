"""PyTorch Lightning: Trainer(strategy="ddp", accelerator="cpu", devices=2)
with sync_with_trainer and DataLoader workers, for DynamicBatchSampler (resumed
from a mid-epoch checkpoint, an end-of-epoch checkpoint and a checkpoint taken
after an epoch's last batch) and for StreamingBatches (resumed mid-epoch):
every epoch is the plain DDP loop's, nothing lost or repeated.

Lightning's "ddp" strategy starts the other process by running this file's
command line again, so the runs are separate scripts: this module run as
``python test_integrations_lightning.py OUT_DIR PHASE DATA [CHECKPOINT]``
(DATA: ``map`` for the sampler, else a shard pattern for StreamingBatches).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from importlib.util import find_spec

import pytest
import torch

# Lightning runs are multi-process (and importing lightning alone takes seconds)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(find_spec("lightning") is None,
                                                   reason="needs the integrations extra (lightning)")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # imports tests.support
EPOCHS, WORKERS, EVERY = 3, 2, 17  # an epoch is 51 batches per process here: steps 17, 34, 51 are checkpoints
STREAM = dict(max_batch_tokens=400, max_batch_size=12, window_samples=60)
STREAM_EVERY = 3


# ---------------------------------------------------------------- the training script

def main(out: str, phase: str, data: str, checkpoint: str | None) -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    from streambatch import DynamicBatchSampler, StreamingBatches
    from streambatch.integrations.lightning import sync_with_trainer
    from tests.support.trainer_runs import BUDGET, CAP, N, lengths

    streaming = data != "map"

    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return N

        def __getitem__(self, i):
            return i

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: list = []

        def setup(self, stage):
            # torch.distributed is up: rank and world size come from it
            if streaming:
                self.batches = StreamingBatches(data, **STREAM)
            else:
                self.batches = DynamicBatchSampler(lengths(), BUDGET, CAP, rank=None, world_size=None)

        def train_dataloader(self):
            sync_with_trainer(self.batches, self.trainer)
            if streaming:
                return DataLoader(self.batches, batch_size=None, num_workers=WORKERS, multiprocessing_context="fork")
            return DataLoader(Items(), batch_sampler=self.batches, collate_fn=torch.tensor, num_workers=WORKERS,
                              multiprocessing_context="fork")

        def training_step(self, batch, batch_idx):
            ids = [s["__key__"] for s in batch] if streaming else batch.tolist()
            self.seen.append([self.current_epoch, batch_idx, ids])
            return self.w.sum() * len(ids)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def on_train_end(self):
            with open(os.path.join(out, f"{phase}{self.global_rank}.json"), "w") as f:
                json.dump(self.seen, f)

    checkpoints = [L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), filename="{epoch}-{step}",
                                                       every_n_train_steps=STREAM_EVERY if streaming else EVERY,
                                                       save_top_k=-1),
                   L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), filename="end-{epoch}",
                                                       every_n_epochs=1, save_top_k=-1)]
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2 if streaming else EPOCHS,
                        default_root_dir=out,
                        logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,
                        callbacks=checkpoints if phase == "first" else [])
    trainer.fit(Model(), ckpt_path=checkpoint)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)


# ---------------------------------------------------------------- the tests

def test_lightning_refuses_to_wrap_the_sampler_and_sync_needs_reloading():
    import lightning as L
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DataLoader, DistributedSampler

    from streambatch import DynamicBatchSampler
    from streambatch.integrations.lightning import sync_with_trainer
    from tests.support.helpers import Echo, lognormal_lengths

    sampler = DynamicBatchSampler(lognormal_lengths(300), 3000, 16, rank=0, world_size=2)
    loader = DataLoader(Echo(), batch_sampler=sampler)
    # what Trainer(use_distributed_sampler=True) does under DDP: it raises, naming the fix
    with pytest.raises(TypeError, match="use_distributed_sampler=False"):
        _update_dataloader(loader, DistributedSampler(range(300), num_replicas=2, rank=0))
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match="reload_dataloaders_every_n_epochs=1"):
        sync_with_trainer(sampler, trainer)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        reload_dataloaders_every_n_epochs=1)
    assert sync_with_trainer(sampler, trainer) is sampler and sampler.epoch == 0


def _launch(out, phase, checkpoint=None, data="map"):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    args = [sys.executable, os.path.abspath(__file__), str(out), phase, data] + ([checkpoint] if checkpoint else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.load(open(os.path.join(out, f"{phase}{r}.json"))) for r in range(2)]


def test_ddp_epochs_and_resumes_match_plain_ddp(tmp_path):
    from tests.support.trainer_runs import check_epoch, plain_ddp

    ref = plain_ddp(EPOCHS)
    assert len(ref[0][0]) == 3 * EVERY  # so that one step checkpoint falls on epoch 0's last batch
    first = _launch(tmp_path, "first")
    for r in range(2):
        for e in range(EPOCHS):
            assert [b for ep, _, b in first[r] if ep == e] == ref[r][e]
    for e in range(EPOCHS):
        check_epoch([ref[r][e] for r in range(2)])
    ckpt = os.path.join(tmp_path, "ckpt")
    resumes = {"mid-epoch": "epoch=1-step=68.ckpt",       # 17 batches into epoch 1
               "after last batch": "epoch=0-step=51.ckpt",  # on_train_batch_end of epoch 0's last batch
               "end of epoch": "end-epoch=0.ckpt"}          # on_train_epoch_end of epoch 0
    assert set(resumes.values()) <= {os.path.basename(p) for p in glob.glob(os.path.join(ckpt, "*.ckpt"))}
    for name, filename in resumes.items():
        phase = "resume-" + name.replace(" ", "-")
        resumed = _launch(tmp_path, phase, os.path.join(ckpt, filename))
        done = 68 if name == "mid-epoch" else 51
        for r in range(2):
            assert resumed[r] == first[r][done:], f"{name}: rank {r} resumed wrongly"


def test_streaming_epochs_and_mid_epoch_resume(tmp_path):
    from streambatch import StreamingBatches
    from tests.support.corpus import index_corpus
    from tests.support.shards import write_corpus
    from tests.support.trainer_runs import check_epoch

    pattern, _, expected = write_corpus(tmp_path / "shards", [31, 27, 40, 22, 35], seed=5)
    index_corpus(pattern)
    first = _launch(tmp_path, "first", data=pattern)
    index = {k: i for i, k in enumerate(sorted(expected))}
    for e in range(2):
        plain = []
        for r in range(2):
            ds = StreamingBatches(pattern, rank=r, world_size=2, **STREAM)
            ds.set_epoch(e)
            plain.append([[s["__key__"] for s in b] for b in ds])
            assert [b for ep, _, b in first[r] if ep == e] == plain[r]
        check_epoch([[[index[k] for k in b] for b in batches] for batches in plain], n=len(expected))
    steps0 = sum(1 for ep, _, _ in first[0] if ep == 0)
    done = (steps0 // STREAM_EVERY + 1) * STREAM_EVERY  # the first step checkpoint inside epoch 1
    assert steps0 < done < len(first[0])
    resumed = _launch(tmp_path, "resumed", os.path.join(tmp_path, "ckpt", f"epoch=1-step={done}.ckpt"), pattern)
    for r in range(2):
        assert resumed[r] == first[r][done:]
