"""Streaming over WebDataset tar shards (sidecar indexes) and other corpus formats (Lhotse Shar, NeMo tarred
audio, Parquet: ``shards/corpora/``): StreamingBatches.

``StreamingBatches`` (``dataset.py``) wires the stages, one sub-package each, lowest first: ``formats``
(tar bytes -> samples), ``io`` (bytes of local and remote shards), ``runtime`` (counters shared with DataLoader
workers, the cross-rank failure channel), ``shards`` (URLs -> catalog), ``pipeline`` (one pass: windows -> this
rank's steps -> bytes -> samples -> batches). The planned windows come from the plan layer,
``streambatch.epoch`` (catalog + epoch -> windows): this package touches bytes, it does not plan.

Stream: batches (``StreamingBatches``); the names below are the public API."""

from ..epoch.windows import EpochSummary
from .dataset import StreamingBatches
from .errors import CacheError, ShardError
from .formats.audio import collate_audio, decode_audio
from .formats.packed import collate_packed
from .io.retry import RetryPolicy
from .io.urls import expand_urls
from .options import IndexSettings, OutputSettings, RemoteSettings
from .shards.catalog import Catalog, open_catalog
from .shards.corpora import FORMATS, CorpusFormat, NemoTarred, Parquet, Shar, WebDataset, register_format
from .shards.indexer import IndexSummary, index_shards
from .shards.lengths import LengthSpec, length_spec
from .shards.sidecar import sidecar_path
from .shards.sources import Source

__all__ = [
    "StreamingBatches", "index_shards", "IndexSummary", "LengthSpec", "length_spec", "sidecar_path",
    "ShardError", "CacheError", "EpochSummary", "Catalog", "open_catalog", "expand_urls", "collate_audio",
    "decode_audio", "Source", "collate_packed", "RetryPolicy", "IndexSettings", "RemoteSettings", "OutputSettings",
    "Shar", "NemoTarred", "Parquet", "WebDataset", "FORMATS", "CorpusFormat", "register_format",
]
