"""The shard-affine planner (``read_mode="shard"``'s): plan layer in ``planner.py`` (a window's samples cut into
per-rank pieces, the carried samples' holders across windows, the pooled outliers), the Numba walk in ``walk.py``,
the matching of cross-rank batches to the ranks holding their samples in ``holders.py``.

Stream: a window's samples -> per-rank steps that read each byte once across the job."""
