"""Detect training frameworks that would re-deal streambatch's per-rank batches.

accelerate's ``prepare`` wraps a DataLoader's batch sampler in
``BatchSamplerShard`` (process ``p`` of ``P`` keeps batches ``p, p + P, ...``)
or, with ``dispatch_batches=True``, iterates it on process 0 only and splits
the collated tensors. Either way a sampler that already yields one rank's
batches loses ``(P - 1) / P`` of the data without an error. Nothing calls the
sampler at ``prepare`` time, so the check runs when iteration starts: it looks
at the Python frames that are iterating us (the ``self`` of each caller) for
accelerate's wrappers. The check imports nothing: if accelerate was never
imported, no wrapper can exist.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

_ACCELERATE = "accelerate.data_loader"
# Frames between us and a wrapper: 1 for BatchSamplerShard's generator, up to
# ~10 for DataLoaderDispatcher creating a multi-worker iterator.
_DEPTH = 24

ACCELERATE_RECIPE = "see 'Using with accelerate / HF Trainer / Lightning' in the README"


def _wrapper_types(*names: str) -> tuple[type, ...]:
    module = sys.modules.get(_ACCELERATE)
    if module is None:
        return ()
    return tuple(t for t in (getattr(module, n, None) for n in names) if isinstance(t, type))


def _callers(frame) -> Iterator[Any]:
    """The ``self`` of each calling frame, innermost first."""
    for _ in range(_DEPTH):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if owner is not None:
            yield owner
        frame = frame.f_back


def accelerate_wrapper(frame, *names: str) -> Any:
    """The innermost caller that is one of accelerate's ``names`` classes, or None."""
    types = _wrapper_types(*names)
    if not types:
        return None
    for owner in _callers(frame):
        # type(): accelerate's loaders report the wrapped DataLoader's class as __class__
        if issubclass(type(owner), types):
            return owner
    return None


def _dispatching(frame) -> bool:
    """Whether accelerate's DataLoaderDispatcher (dispatch_batches=True) with
    several processes is iterating us."""
    dispatcher = accelerate_wrapper(frame, "DataLoaderDispatcher")
    return dispatcher is not None and getattr(getattr(dispatcher, "state", None), "num_processes", 2) > 1


def check_per_rank_sampler(sampler: Any) -> None:
    """Raise if accelerate is dealing out the batches of a per-rank sampler.

    Called by ``DynamicBatchSampler.__iter__``: its batches are this rank's
    already, so accelerate's ``BatchSamplerShard`` (``P > 1`` processes) would
    keep 1 of every ``P`` of them, and ``DataLoaderDispatcher`` would train all
    processes on process 0's share.
    """
    frame = sys._getframe(1)
    shard = accelerate_wrapper(frame, "BatchSamplerShard")
    if shard is not None and getattr(shard, "num_processes", 1) > 1 and shard.batch_sampler is sampler:
        raise ValueError(
            f"accelerate is dealing this DynamicBatchSampler's batches across {shard.num_processes} processes, but "
            f"they are already the batches of rank {sampler.rank} of {sampler.world_size}: each process would "
            f"train on 1/{shard.num_processes} of its share and the rest would be lost. Wrap it before "
            "accelerator.prepare: DataLoader(dataset, batch_sampler=GlobalBatchSampler(sampler)) with "
            "`from streambatch.integrations import GlobalBatchSampler`; " + ACCELERATE_RECIPE)
    if _dispatching(frame):
        raise ValueError(
            "accelerate's dispatch_batches=True iterates this DynamicBatchSampler on process 0 only and splits its "
            "collated batches across processes, which loses the other ranks' batches and the token budget. Use "
            "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False)) and "
            "GlobalBatchSampler(sampler); " + ACCELERATE_RECIPE)


def check_dealt(view: Any, world_size: int) -> None:
    """Raise unless a view yielding every rank's batches is dealt out to ranks.

    A global view yields each step's ``world_size`` batches; under
    ``torch.distributed`` with several processes only accelerate's
    ``BatchSamplerShard`` with ``world_size`` processes turns that into one
    batch per rank. In a plain DDP loop every rank would train on all batches.
    Without ``torch.distributed`` (inspecting a view, one process) it is allowed.
    """
    frame = sys._getframe(1)
    if _dispatching(frame):
        raise ValueError(
            f"accelerate's dispatch_batches=True splits the collated batches of {type(view).__name__} across "
            "processes instead of dealing out whole batches; use Accelerator(dataloader_config="
            "DataLoaderConfiguration(dispatch_batches=False)); " + ACCELERATE_RECIPE)
    shard = accelerate_wrapper(frame, "BatchSamplerShard")
    if shard is not None:
        if shard.num_processes != world_size or shard.split_batches:
            raise ValueError(
                f"{type(view).__name__} plans steps of {world_size} batches but accelerate deals them to "
                f"{shard.num_processes} processes (split_batches={shard.split_batches}); build the "
                f"DynamicBatchSampler with world_size={shard.num_processes} (or rank/world_size None under "
                "torch.distributed) and use split_batches=False")
        return
    import torch.distributed as dist

    if world_size > 1 and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise ValueError(
            f"{type(view).__name__} yields all {world_size} ranks' batches of every step, for accelerate to deal "
            "out; here nothing deals them, so every process would train on every batch. Pass the DataLoader "
            "through accelerator.prepare, or in a plain DDP loop use the DynamicBatchSampler itself")


def check_not_prepared(dataset: Any) -> None:
    """Raise if accelerate's prepared DataLoader drives a StreamingBatches.

    accelerate wraps an IterableDataset in ``IterableDatasetShard`` (which
    cannot take whole batches: ``batch_size=None``) or ``DataLoaderDispatcher``
    (process 0 reads, the others get slices of its batches), and sets the
    dataset's epoch from its own iteration counter. Both prepared loaders call
    ``set_epoch`` at the start of each pass, which is where this runs.
    """
    frame = sys._getframe(1)
    wrapper = accelerate_wrapper(frame, "DataLoaderShard", "DataLoaderDispatcher", "IterableDatasetShard")
    if wrapper is not None:
        raise ValueError(
            f"a StreamingBatches DataLoader was passed to accelerator.prepare ({type(wrapper).__name__}); it "
            f"already yields the batches of rank {dataset.rank} of {dataset.world_size}, which accelerate would "
            "re-split or re-read on process 0. Iterate it directly: call ds.set_epoch(epoch) each epoch, move "
            "batches with accelerate.utils.send_to_device(batch, accelerator.device), and for resuming use a "
            "torchdata StatefulDataLoader with accelerator.register_for_checkpointing(loader); "
            + ACCELERATE_RECIPE)
