"""The plan layer: a dataset's epochs as planned windows (pure numpy; the Numba kernels are the planners').

Between the glue (``DynamicBatchSampler``, ``StreamingBatches``) and the planners: ``epoch_plan.EpochPlan`` is
the one object both hold, over shards (``ShardSource``) or over lengths in memory (``in_memory.InMemory``: one
source, one window). ``read_modes.READ_MODES`` is the one read-mode dispatch, filled by the window loops:
``sample_loop`` (each window planned across all ranks, elastic resume by replanning) and ``shard_loop`` (each rank
trains a contiguous piece of the window's shards: the shard-affine planner); ``mixed_windows`` cuts a mix of
shard lists into windows; ``windows`` holds the vocabulary (``WindowConfig``, the cuts, seeds, ``Window``,
``EpochSummary``); ``interleave`` orders a mix's steps by source; ``elastic`` finishes an epoch on another world
size. Every plan is made by ``planners.plan_epoch`` with the configuration's batch rule bound once per plan.

Stream: a catalog (or lengths) and an epoch -> ``Window`` objects (plan + the reads of each rank), in step order."""

# The window loops register their read modes (read_modes.READ_MODES) when imported: importing any module of
# this package runs this first, so the registry is full before a configuration is checked against it.
from . import sample_loop, shard_loop  # noqa: F401
