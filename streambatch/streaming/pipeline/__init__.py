"""The parts of ``StreamingBatches`` (``dataset.py``): constructor-time setup, state and resume, and the
reading generator that turns this rank's steps into batches.

Stage: windows -> this rank's steps -> byte reads -> samples -> decode -> collate -> batches."""
