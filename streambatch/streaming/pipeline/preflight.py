"""``StreamingBatches.preflight``: an epoch's planned batches as shapes, for ``torch_glue/preflight.py``.

The dataset's ``EpochPlan`` (the plan layer, ``epoch/epoch_plan.py``) plans
the epoch window by window from the catalog's lengths (no tar is read), at
this world size after the epoch's elastic history, exactly as a pass plans
it; each window's batches become ``BatchShapes`` with their epoch steps.
Nothing here plans, and nothing of the dataset's position changes.

Stream: the epoch's ``Window`` objects -> one ``BatchShapes`` of every rank's batches, in step order."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.config import check_epoch
from ...core.limits import BatchShapes
from ...torch_glue.preflight import PreflightReport, run_preflight


def epoch_shapes(ds: Any, epoch: int | None = None) -> BatchShapes:
    """Every batch of ``ds``'s epoch (default: the current one), every rank, in step order."""
    e = ds.epoch if epoch is None else check_epoch(epoch)
    cat = ds.catalog
    parts = []
    for w in ds.plan.windows(e, ds.progress.segments(e)):
        lengths = cat.all_lengths[cat.starts[w.shard_ids] + w.local].astype(np.int64)
        parts.append(BatchShapes.of_plan(w.plan, lengths, w.first_step))
    return BatchShapes.concat(parts)


def preflight_streaming(ds: Any, step: Any, epoch: int | None = None, **options: Any) -> PreflightReport:
    """``run_preflight`` over ``ds``'s epoch (options: ``run_preflight``'s)."""
    return run_preflight(epoch_shapes(ds, epoch), step, packed=ds.config.limits.pack, **options)
