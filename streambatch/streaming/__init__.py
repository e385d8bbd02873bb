"""Streaming over WebDataset tar shards: sidecar indexes and StreamingBatches."""

from .dataset import StreamingBatches
from .epoch.windows import EpochSummary
from .errors import CacheError, ShardError
from .formats.audio import collate_audio, decode_audio
from .io.urls import expand_urls
from .shards.catalog import Catalog, open_catalog
from .shards.indexer import IndexSummary, index_shards
from .shards.lengths import LengthSpec, length_spec
from .shards.sidecar import sidecar_path
from .shards.sources import Source

__all__ = [
    "StreamingBatches", "index_shards", "IndexSummary", "LengthSpec", "length_spec", "sidecar_path",
    "ShardError", "CacheError", "EpochSummary", "Catalog", "open_catalog", "expand_urls", "collate_audio",
    "decode_audio", "Source",
]
