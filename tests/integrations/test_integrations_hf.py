"""Hugging Face Trainer: DynamicBatchTrainer on a tiny model, 2 gloo processes
on CPU, interrupted mid-epoch and resumed with resume_from_checkpoint: each
process trains the plain DDP loop's batches (planned epochs laid end to end),
nothing lost, nothing repeated."""

from __future__ import annotations

import os
from importlib.util import find_spec

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.helpers import free_port
from tests.support.trainer_runs import (
    BUDGET,
    CAP,
    WORLD,
    N,
    check_epoch,
    lengths,
    plain_ddp,
    rank_env,
    read_ranks,
    write_json,
)

# multi-process Trainer runs; transformers is imported only by them (not at collection)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(find_spec("transformers") is None or find_spec("accelerate") is None,
                                                   reason="needs the integrations extra (transformers, accelerate)")]

ACCUMULATE = 2  # batches per optimizer step
EPOCHS = 3
# Optimizer steps before the checkpoint the second run resumes from: 3 steps
# into the second epoch (an epoch is 51 batches = 26 optimizer steps here), so
# the Trainer resumes in epoch 1 by skipping 6 batches of it.
SAVE_AT = 29


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"idx": i, "x": float(i)}


class Tiny(torch.nn.Module):
    """Records the sample indices of every batch it trains on."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def forward(self, idx, x):
        self.seen.append(idx.tolist())
        return {"loss": (self.w * x).mean()}


def _run(rank, port, out, phase):
    from transformers import TrainingArguments

    from streambatch import DynamicBatchSampler
    from streambatch.integrations.hf import DynamicBatchTrainer

    rank_env(rank, port)
    first = phase == "first"
    args = TrainingArguments(
        output_dir=os.path.join(out, "run"), use_cpu=True, ddp_backend="gloo", report_to=[], disable_tqdm=True,
        num_train_epochs=EPOCHS, max_steps=SAVE_AT + 2 if first else -1, save_strategy="steps", save_steps=SAVE_AT,
        gradient_accumulation_steps=ACCUMULATE, learning_rate=1e-3, logging_steps=1000, seed=0)
    sampler = DynamicBatchSampler(lengths(), BUDGET, CAP, rank=None, world_size=None)  # after TrainingArguments
    model = Tiny()
    trainer = DynamicBatchTrainer(model=model, args=args, train_dataset=Items(), train_batch_sampler=sampler)
    trainer.train(resume_from_checkpoint=None if first else os.path.join(out, "run", f"checkpoint-{SAVE_AT}"))
    write_json(os.path.join(out, f"{phase}{rank}.json"), {"seen": model.seen, "steps": trainer.train_batches.steps})
    # a clean exit, as examples/hf_trainer.py's: the trainer (its DDP model holds the group) freed first, then the
    # group ended on every rank; a process exiting with its gloo group alive can abort (a fresh-clone CI run
    # saw SIGABRT here after both phases trained)
    import gc

    import torch.distributed as dist

    del trainer
    gc.collect()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def test_trainer_resume_matches_plain_ddp(tmp_path):
    for phase in ("first", "resumed"):
        mp.start_processes(_run, args=(free_port(), str(tmp_path), phase), nprocs=WORLD, start_method="spawn")
    first, resumed = read_ranks(tmp_path, "first{r}.json"), read_ranks(tmp_path, "resumed{r}.json")
    ref = plain_ddp(EPOCHS)
    steps = first[0]["steps"]
    assert steps == len(ref[0][0])
    assert [len(ref[0][e]) for e in range(EPOCHS)] != [steps] * EPOCHS  # planned epochs differ in length
    # batches trained when the checkpoint was saved: the Trainer's last step of an
    # epoch takes the odd batch, so an epoch is ceil(steps / ACCUMULATE) optimizer steps
    epochs_done, updates = divmod(SAVE_AT, -(-steps // ACCUMULATE))
    before = epochs_done * steps + updates * ACCUMULATE
    for r in range(WORLD):
        trained = first[r]["seen"][:before] + resumed[r]["seen"]
        stream = [b for e in range(EPOCHS) for b in ref[r][e]]
        assert trained == stream[: EPOCHS * steps]  # the plain DDP batches in order, nothing lost or repeated
    assert epochs_done == 1 and updates > 0  # resumed inside the second epoch
    check_epoch([ref[r][0] for r in range(WORLD)])  # planned epoch 0 is the first Trainer epoch, whole
