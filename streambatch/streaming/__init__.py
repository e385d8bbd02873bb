"""Streaming over WebDataset tar shards: sidecar indexes and StreamingBatches."""

from .audio import collate_audio, decode_audio
from .catalog import Catalog, open_catalog
from .dataset import StreamingBatches
from .index import IndexSummary, LengthSpec, index_shards, length_spec, sidecar_path
from .shards import ShardError, expand_urls
from .window import EpochSummary

__all__ = [
    "StreamingBatches", "index_shards", "IndexSummary", "LengthSpec", "length_spec", "sidecar_path",
    "ShardError", "EpochSummary", "Catalog", "open_catalog", "expand_urls", "collate_audio", "decode_audio",
]
