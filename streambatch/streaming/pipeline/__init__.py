"""The stages of one pass of ``StreamingBatches`` (``dataset.py`` wires them), each iterator in, iterator out:

- ``steps``: planned windows -> this rank's (and DataLoader worker's) steps; ``Progress`` / ``Cursor`` hold the
  position (``state_dict``);
- ``reads``: steps -> the tar bytes of their samples (local by offset, remote through the cache);
- ``samples``: bytes -> sample dicts -> decoded -> failed ones raised or skipped (``on_error``);
- ``state``: a saved state checked before a resume, and the state's format.

Stream: windows -> this rank's steps -> byte reads -> samples -> decode -> batches."""
