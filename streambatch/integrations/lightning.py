"""PyTorch Lightning: the epoch and the resume position from the trainer's own loop.

Lightning reads ``len(train_dataloader)`` when it sets the loader up and
stops each epoch after that many batches, so a plan whose length changes
with the epoch needs ``Trainer(reload_dataloaders_every_n_epochs=1)``: then
``train_dataloader()`` runs at the start of every epoch, before Lightning
asks for the length or starts the loader's workers. Calling
``sync_with_trainer(sampler, self.trainer)`` there sets the epoch, and after a
restart the first batch not yet trained, from the loop progress Lightning
saves in every checkpoint. No state of ours goes into the checkpoint, and
nothing depends on when Lightning calls its hooks or how far the loader's
workers have prefetched.

Lightning's ``use_distributed_sampler=True`` (the default) cannot wrap a
``DynamicBatchSampler`` and raises; set it to ``False`` (the sampler already
yields this rank's batches). ``StreamingBatches`` is an ``IterableDataset``,
which Lightning leaves alone.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from ..streaming.dataset import StreamingBatches
    from ..torch_glue.sampler import DynamicBatchSampler

B = TypeVar("B", "DynamicBatchSampler", "StreamingBatches")

# Lightning warns on every mid-epoch restart of a loader without state_dict();
# the position here comes from its loop progress instead, so that warning does
# not apply to the loaders this module positions.
_NOT_RESUMABLE = "You're resuming from a checkpoint that ended before the epoch ended and your dataloader"


def trainer_position(trainer: Trainer) -> tuple[int, int]:
    """(epoch, batches already trained in it) that ``trainer`` runs next.

    From the fit loop's progress counters: an epoch is under way (restored
    from a mid-epoch checkpoint) when it was started but not processed; then
    its processed batches are the ones trained. Otherwise the next epoch
    starts from its first batch.
    """
    fit = trainer.fit_loop
    # _ProcessedTrackers at run time; lightning annotates them as their base class, without these counters
    epochs: Any = fit.epoch_progress.current
    if epochs.started > epochs.processed:
        batches: Any = fit.epoch_loop.batch_progress.current
        return int(epochs.processed), int(batches.processed)
    return int(epochs.processed), 0


def sync_with_trainer(batches: B, trainer: Trainer) -> B:
    """Set ``batches`` to the epoch and batch ``trainer`` runs next; return it.

    batches: a ``DynamicBatchSampler`` (per rank; ``use_distributed_sampler=False``)
        or a ``StreamingBatches``.
    trainer: the Lightning ``Trainer``, built with
        ``reload_dataloaders_every_n_epochs=1``.

    Call it in ``train_dataloader()`` on every rank (with ``verify`` on, the
    sampler's ``set_epoch`` is a collective).
    """
    if getattr(trainer, "reload_dataloaders_every_n_epochs", None) != 1:
        raise ValueError(
            "sync_with_trainer needs Trainer(reload_dataloaders_every_n_epochs=1), got "
            f"{getattr(trainer, 'reload_dataloaders_every_n_epochs', None)!r}: Lightning reads the number of batches "
            "once per setup, and streambatch plans a different number of steps each epoch")
    epoch, start = trainer_position(trainer)
    batches.set_epoch(epoch)
    if start >= len(batches):  # saved after the epoch's last batch: Lightning moves on to the next epoch
        epoch, start = epoch + 1, 0
        batches.set_epoch(epoch)
    batches.set_start_batch(start)
    if start:
        warnings.filterwarnings("ignore", message=_NOT_RESUMABLE)
    return batches
