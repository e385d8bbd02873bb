"""The catalog stage: the shard lists and what is known about them before any epoch. ``lists`` expands
them once and opens the catalog (``catalog``: every shard's counts, lengths and locality, from sidecars or a
``*.catalog.npz`` with its trust rules); sidecar indexes, shard identity (size/ETag/content digests), length
sources, the indexer, and mixes of several shard lists (``sources``).

Stream: URLs -> a ``Catalog`` (per shard: sample counts, lengths; per window: offsets and keys)."""
