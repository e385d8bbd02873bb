"""Streaming over WebDataset tar shards: sidecar indexes and StreamingBatches."""

from .audio import collate_audio, decode_audio
from .catalog import Catalog, open_catalog
from .dataset import StreamingBatches
from .errors import CacheError, ShardError
from .indexer import IndexSummary, index_shards
from .lengths import LengthSpec, length_spec
from .reader import expand_urls
from .sidecar import sidecar_path
from .sources import Source
from .window import EpochSummary

__all__ = [
    "StreamingBatches", "index_shards", "IndexSummary", "LengthSpec", "length_spec", "sidecar_path",
    "ShardError", "CacheError", "EpochSummary", "Catalog", "open_catalog", "expand_urls", "collate_audio",
    "decode_audio", "Source",
]
