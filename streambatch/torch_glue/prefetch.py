"""Telling when a plain multi-worker ``DataLoader`` draws batches from
``DynamicBatchSampler`` ahead of the training loop, so that a state saved
then would skip the prefetched batches on resume."""

from __future__ import annotations

import types
import warnings
import weakref


def prefetching_loader(frame: types.FrameType | None) -> weakref.ref | None:
    """A weak reference to the torch multi-worker DataLoader iterator whose
    ``next(sampler_iter)`` is running in ``frame``, else None. (torchdata's
    StatefulDataLoader has its own iterator classes and saves exact states.)"""
    if frame is None:
        return None
    try:
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    except ImportError:
        return None
    it = frame.f_locals.get("self")
    return weakref.ref(it) if isinstance(it, _MultiProcessingDataLoaderIter) else None


def warn_if_ahead(prefetcher: weakref.ref | None, start: int, consumed: int, epoch: int) -> None:
    """Warn (as the caller of the caller) when the loader iterator behind
    ``prefetcher`` has received fewer batches than the sampler handed out
    (``consumed``; the iterator began at batch ``start``)."""
    it = prefetcher() if prefetcher is not None else None
    received = getattr(it, "_num_yielded", None)
    if received is None:
        return
    received += start
    if received < consumed:
        warnings.warn(
            f"DynamicBatchSampler.state_dict() read while a DataLoader with {getattr(it, '_num_workers', '?')} "
            f"workers prefetches from it: the sampler has handed out {consumed} batches of epoch "
            f"{epoch}, the loop has received {received}. Resuming from this state would skip "
            f"{consumed - received} batches: use torchdata's StatefulDataLoader, or save your own step "
            "count and resume with set_epoch(epoch) + set_start_batch(step)", RuntimeWarning, stacklevel=3)
