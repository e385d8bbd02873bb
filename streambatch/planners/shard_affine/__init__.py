"""Shard-affine windows (``read_mode="shard"``): the cut of a window's shards into per-rank pieces
(``plan``), the carried samples' holders across windows (``holders``) and the Numba step kernels (``kernels``).

Stream: a window's shards -> per-rank steps that read each byte once across the job."""
