"""The epoch-plan stage: the catalog's shards cut into windows and each window planned into steps.

``plan.EpochPlan`` is the stage a dataset holds; ``modes.READ_MODES`` is the one read-mode dispatch (each
mode's strategy): ``sample_mode`` (each window planned across all ranks, elastic resume by replanning) and
``shard_mode`` (each rank trains a contiguous piece of the window's shards, ``affinity/``); ``mixes`` cuts a
mix of sources into windows; ``windows`` holds the cuts, seeds, ``WindowConfig`` and ``Window``.

Stream: a catalog and an epoch -> ``Window`` objects (plan + the reads of each rank), in step order."""
