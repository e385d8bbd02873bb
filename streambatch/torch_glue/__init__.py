"""torch glue for map-style loading: ``DynamicBatchSampler`` and the
``torch.distributed`` helpers (world layout, cross-rank agreement checks)."""
