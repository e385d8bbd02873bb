"""Epoch planning: the catalog's shards cut into windows and each window planned into steps.

``modes.READ_MODES`` is the one read-mode dispatch: ``sample_mode`` (each window planned across all ranks,
elastic resume by replanning) and ``shard_mode`` (each rank trains a contiguous piece of the window's shards,
``affinity/``). Stage: a catalog and an epoch -> ``Window`` objects (plan + the reads of each rank)."""
