"""The shard lists and what is known about them before any epoch: URL expansion, sidecar indexes,
shard identity (size/ETag/content digests), length sources, the indexer, the catalog (every shard's counts and
lengths, from sidecars or a ``*.catalog.npz``, with its trust rules) and mixes of several shard lists (``Source``).

Stage: URLs -> a ``Catalog`` (per shard: sample counts, offsets, lengths)."""
