"""Byte reads: local files and remote objects (fsspec), ranged reads, streams, the node-local cache, the
window reader and retries.

Stage: a rank's reads of a window (shard, first sample, end) -> tar bytes of its samples."""
