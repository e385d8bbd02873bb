"""WebDataset tars: samples grouped by key (webdataset's rule), with a
streambatch sidecar per shard (``streambatch index``: keys, lengths, byte
offsets) or one catalog file. The format every other one falls back to: its
catalog is opened by ``shards/lists.py`` (sidecars, catalog files, indexing
missing local shards), its samples parsed by ``formats/tar_samples.py``.

Stream: nothing: the format's registry entry and spec."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .base import CorpusFormat


@dataclass(frozen=True)
class WebDataset:
    """WebDataset tar shards: a brace pattern, a path, a list of them, or a ``*.catalog.npz``."""

    urls: Any


def claims(given: Any) -> bool:
    """Anything the other formats do not claim: tar paths, patterns, URLs, catalog files."""
    return isinstance(given, (str, os.PathLike, list, tuple))


FORMAT = CorpusFormat("webdataset", WebDataset, claims, "WebDataset tars with streambatch sidecars (the default)",
                      build=WebDataset)
