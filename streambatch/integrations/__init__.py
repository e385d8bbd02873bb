"""Using streambatch inside the trainers that re-shard data loaders.

- ``GlobalBatchSampler`` (accelerate): each step's batches of every rank, for
  ``accelerator.prepare`` to deal out, one per process.
- ``FixedLengthEpochs``: the same in epochs of a fixed number of steps, for
  trainers that read ``len()`` once (the Hugging Face ``Trainer``).
- ``streambatch.integrations.hf.DynamicBatchTrainer``: a ``transformers.Trainer``
  that trains on a ``DynamicBatchSampler``'s batches.
- ``streambatch.integrations.lightning.sync_with_trainer``: sets a sampler's
  or a ``StreamingBatches``' epoch and resume position from a Lightning trainer.
- ``guard``: the checks that raise when a framework would re-deal per-rank
  batches (silently losing data) instead.

The ``hf`` and ``lightning`` modules import their framework; this package and
the views do not.
"""

from .accelerate import FixedLengthEpochs, GlobalBatchSampler

__all__ = ["FixedLengthEpochs", "GlobalBatchSampler"]
