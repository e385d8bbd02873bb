"""A Hugging Face ``transformers.Trainer`` that trains on ``DynamicBatchSampler`` batches.

The ``Trainer`` builds its training DataLoader from ``per_device_train_batch_size``
and passes it through ``accelerator.prepare``, and it assumes every epoch has
``len(train_dataloader)`` batches (its epoch count, learning-rate schedule and
resume position are computed from that). ``DynamicBatchTrainer`` replaces the
DataLoader with one over ``FixedLengthEpochs(sampler)``: accelerate deals each
step's batches one per process, every epoch has the same length, and
``resume_from_checkpoint`` skips exactly the batches already trained (the
``Trainer`` skips them itself with ``accelerate.skip_first_batches``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback

from .accelerate import FixedLengthEpochs

if TYPE_CHECKING:
    from ..torch_glue.sampler import DynamicBatchSampler


class _EpochCallback(TrainerCallback):
    """Selects the view's epoch before each of the Trainer's epochs.

    The Trainer also calls ``set_epoch`` on the sampler it finds, but not in
    the epoch it resumes (the sampler is then behind accelerate's
    ``SkipBatchSampler``), so the epoch is counted here the way the Trainer
    counts it: ``global_step // update steps per epoch`` at the start.
    """

    def __init__(self, view: FixedLengthEpochs):
        self.view = view
        self.epoch = 0

    def on_train_begin(self, args, state, control, **kwargs):
        steps = self.view.steps  # batches per process per epoch
        accumulation = args.gradient_accumulation_steps
        per_epoch = max(steps // accumulation + int(steps % accumulation > 0), 1)
        self.epoch = state.global_step // per_epoch

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.view.set_epoch(self.epoch)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.epoch += 1


class DynamicBatchTrainer(Trainer):
    """``transformers.Trainer`` whose training batches come from a ``DynamicBatchSampler``.

    ``train_batch_sampler``: a ``DynamicBatchSampler`` over ``train_dataset``
    planned for all processes: build it after ``TrainingArguments`` (which
    starts ``torch.distributed``) with ``rank=None, world_size=None``.
    ``per_device_train_batch_size`` is not used for training; the sampler's
    token budget and batch-size cap decide the batches. Each Trainer epoch is
    ``FixedLengthEpochs(train_batch_sampler).steps`` steps (the length of the
    sampler's planned epoch 0); see ``FixedLengthEpochs`` for how planned
    epochs of other lengths are laid end to end.
    """

    def __init__(self, *args: Any, train_batch_sampler: DynamicBatchSampler, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        processes = self.accelerator.num_processes
        if getattr(train_batch_sampler, "world_size", None) != processes:
            raise ValueError(
                f"train_batch_sampler plans for world_size={getattr(train_batch_sampler, 'world_size', None)} but "
                f"the Trainer runs {processes} processes; build the DynamicBatchSampler after TrainingArguments "
                "with rank=None, world_size=None (or world_size=accelerator.num_processes)")
        self.train_batch_sampler = train_batch_sampler
        self.train_batches = FixedLengthEpochs(train_batch_sampler)
        self.add_callback(_EpochCallback(self.train_batches))

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        args = self.args
        # What Trainer._get_dataloader does for a sampler of its own, with our batch sampler.
        dataset, collate = self.train_dataset, self.data_collator
        try:
            import datasets
        except ImportError:
            datasets = None
        if datasets is not None and isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collate = self._get_collator_with_removed_columns(collate, description="training")
        params: dict[str, Any] = {
            "batch_sampler": self.train_batches,
            "collate_fn": collate,
            "num_workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory,
            "persistent_workers": args.dataloader_persistent_workers,
        }
        if args.dataloader_num_workers > 0:
            params["prefetch_factor"] = args.dataloader_prefetch_factor
        return self.accelerator.prepare(DataLoader(dataset, **params))
