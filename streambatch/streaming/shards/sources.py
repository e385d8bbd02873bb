"""Several weighted shard sources streamed as one mixed epoch.

``StreamingBatches([Source("s3://a/{0000..0999}.tar", weight=0.6),
Source("data/b-*.tar", weight=0.4)], ...)``. The mixing semantics are those
of ``streambatch.core.mix`` (cycles, per-epoch quotas, positions), at shard
granularity for I/O:

- A source's *cycle* visits its shards in an order drawn from
  (seed, source, cycle), each shard's samples in tar order; so every sample
  of the source comes exactly once per cycle.
- Epoch ``e`` takes stream positions ``[e * c_i, (e + 1) * c_i)`` of source
  ``i`` (``c_i`` its quota), continuing the cycle where the last epoch
  stopped, possibly inside a shard.
- The epoch is cut into ``J = max(1, E // window_samples)`` windows (``E``
  the epoch's samples); window ``j`` takes the ``j``-th ``1/J`` of every
  source's range, so each window mixes the sources in proportion (up to
  rounding by one sample per source) and is planned as one set, balanced and
  budgeted across ranks like any window. In ``read_mode="shard"`` each
  source's part of a window is cut into W pieces on its own
  (``epoch/shard_loop.py``), so every rank streams a slice of every source.

Pure numpy plus sidecar reads (through ``Catalog``); no torch. An epoch's
windows of a mix (the ``J`` windows above) are cut by ``epoch/mixed_windows.py``.

Stream: nothing: the sources of a mix, opened as one ``SourceCatalog``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.mix import Mix, SourceSpec
from ...core.redact import scrub
from ...core.types import IntLike, UrlsLike
from .catalog import Catalog


@dataclass(frozen=True)
class Source:
    """One corpus of a mix: its shards and its share of an epoch.

    urls: brace pattern, path or list of shard URLs (as ``StreamingBatches``).
    weight: relative share (every source of a mix has one, or none has);
        or ``samples``: samples per epoch; or ``repeat``: times its size per
        epoch (default 1: every sample once per epoch).
    index_dir: where its sidecars are (default: the dataset's ``index_dir``).
    name: a label for reports (default: ``source{i}``).
    format: its corpus format (``"shar"``, ``"nemo"``, ``"parquet"``, ``"webdataset"``; default: the
        dataset's ``format``, else detected from ``urls``, which may also be a format's spec object).
    """

    urls: UrlsLike | Any
    weight: float | None = None
    samples: int | None = None
    repeat: float | None = None
    index_dir: str | None = None
    name: str | None = None
    format: str | None = None

    def __post_init__(self) -> None:
        self.spec()  # validate now, naming the bad value

    def spec(self) -> SourceSpec:
        return SourceSpec(self.weight, self.samples, self.repeat)

    def __repr__(self) -> str:
        # URLs (and pipe: commands) may carry credentials; a repr ends up in logs and tracebacks
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("weight", "samples", "repeat", "index_dir", "name",
                                                                   "format")
                           if getattr(self, k) is not None)
        return scrub(f"Source({self.urls!r}" + (f", {fields}" if fields else "") + ")")


def is_sources(urls: Any) -> bool:
    """True if ``urls`` is a Source or a non-empty list of Sources; a list
    mixing Sources and plain URLs is refused."""
    if isinstance(urls, Source):
        return True
    if isinstance(urls, (list, tuple)) and urls and any(isinstance(u, Source) for u in urls):
        if not all(isinstance(u, Source) for u in urls):
            raise TypeError("a list of sources must hold only Source(...) entries; wrap plain shard URLs in "
                            "Source(urls) too")
        return True
    return False


@dataclass(frozen=True)
class SourceCatalog:
    """All sources' shards as one catalog, with each source's shard range.

    catalog: every shard of source 0, then source 1, ... (global shard ids);
    bounds: (S + 1,) int64, source i owns shards ``bounds[i]:bounds[i + 1]``;
    mix: sizes (samples per source) and per-epoch quotas; names: labels.
    """

    catalog: Catalog
    bounds: np.ndarray
    mix: Mix
    names: tuple[str, ...]

    def key(self) -> str:
        return f"{self.mix.key()}{list(self.bounds.tolist())}"


def source_label(sources: Sequence[Source], i: int) -> str:
    """How messages name source ``i``: its ``name``, else ``source i``."""
    return sources[i].name or f"source {i}"


def mix_sources(sources: Sequence[Source], catalogs: Sequence[Catalog], samples_per_epoch: IntLike | None = None
                ) -> SourceCatalog:
    """The mix of ``sources`` over their opened catalogs (one each, in order)."""
    sizes = [c.num_samples for c in catalogs]
    empty = [i for i, n in enumerate(sizes) if n == 0]
    if empty:
        raise ValueError(f"source {empty[0]} ({scrub(repr(sources[empty[0]].urls)[:100])}) holds no samples; remove it")
    mix = Mix.build(sizes, [s.spec() for s in sources], samples_per_epoch)
    catalog = _concat(list(catalogs))
    bounds = np.concatenate([[0], np.cumsum([len(c.urls) for c in catalogs])]).astype(np.int64)
    names = tuple(s.name or f"source{i}" for i, s in enumerate(sources))
    return SourceCatalog(catalog, bounds, mix, names)


def _concat(cats: list[Catalog]) -> Catalog:
    """One catalog of every source's shards, in order (global shard ids)."""
    dtype = np.result_type(*[c.all_lengths.dtype for c in cats])
    all_lengths = np.concatenate([c.all_lengths.astype(dtype, copy=False) for c in cats])
    counts = np.concatenate([c.counts for c in cats]).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    layouts = None
    if any(c.layouts is not None for c in cats):  # sources of other formats: each shard keeps its layout
        layouts = tuple(lay for c in cats for lay in (c.layouts or (None,) * len(c.urls)))
    return Catalog(tuple(u for c in cats for u in c.urls), tuple(p for c in cats for p in c.sidecars), counts,
                   tuple(d for c in cats for d in c.digests), all_lengths, starts, layouts=layouts)
