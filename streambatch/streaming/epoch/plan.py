"""The epoch-plan stage of ``StreamingBatches``: a dataset's epochs as planned
windows, at the world size of each elastic segment.

One object per dataset holds what every epoch is planned from: the catalog
(or a mix's ``SourceCatalog``), the ``WindowConfig`` and the read mode's
strategy (``modes.ReadMode``, resolved once). ``windows(epoch, segments)``
is the stream every pass reads; ``summary`` plans an epoch from lengths only
(no tar is read) and is cached. Pure numpy, no torch, no I/O beyond the
catalog's lengths, so every rank and worker computes the same windows.

Stream: ``Window`` objects of one epoch (a window's plan and each rank's reads), in step order."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from ...core.plan import config_fingerprint
from ...core.redact import logger
from ...planners.elastic import Segments
from ..shards.catalog import Catalog
from ..shards.sources import SourceCatalog
from .mixes import mixed_inputs, source_of_shards
from .modes import ReadMode, summarize
from .sample_mode import summarize_windows
from .windows import EpochSummary, Window, WindowConfig

log = logger("streambatch.streaming")


class EpochPlan:
    """Every epoch of one dataset, window by window.

    catalog: every shard (a mix's shards, source after source); sources: the
    mix, or None for one shard list; config: its ``world_size`` is this
    run's; auto_window: ``window_samples`` was not given, so it follows the
    world size (``mode.default_window``) when an elastic history names
    another world.
    """

    def __init__(self, catalog: Catalog, sources: SourceCatalog | None, config: WindowConfig, mode: ReadMode,
                 auto_window: bool):
        self.catalog, self.sources, self.config, self.mode = catalog, sources, config, mode
        self.auto_window = auto_window
        self._summaries: dict[tuple[int, Segments], EpochSummary] = {}

    def config_at(self, world_size: int) -> WindowConfig:
        """The config as a run at ``world_size`` built it (the default
        ``window_samples`` of shard mode depends on the world size)."""
        c = self.config
        window = self.mode.default_window(world_size) if self.auto_window else c.window_samples
        return dataclasses.replace(c, world_size=world_size, window_samples=window)

    def fingerprint_at(self, world_size: int) -> int:
        """The state fingerprint of these shards (and sources) and settings at ``world_size``."""
        fp = self.config_at(world_size).fingerprint(self.catalog.fingerprint())
        if self.sources is not None:
            mix = self.sources.mix
            fp = config_fingerprint(np.array(mix.sizes + mix.counts + tuple(self.sources.bounds.tolist()),
                                             dtype=np.int64), fp)
        return fp

    @property
    def samples_per_epoch(self) -> int:
        """Samples an epoch plans: the mix's quotas, or every sample once."""
        return self.sources.mix.samples_per_epoch if self.sources is not None else self.catalog.num_samples

    def source_positions(self, epoch: int) -> list[tuple[int, int]]:
        """Per source, (cycle, sample position in it) at the start of ``epoch``."""
        return self.sources.mix.positions(epoch) if self.sources is not None else [(epoch, 0)]

    def windows(self, epoch: int, segments: Segments = ()) -> Iterator[Window]:
        """The epoch's planned windows, at this world size after ``segments``
        (the finished ``(world_size, steps)`` runs of an elastic resume)."""
        mode, c, cat = self.mode, self.config, self.catalog
        if self.sources is None and not segments:
            return mode.plain(cat.counts, cat.lengths, c, epoch)
        if self.sources is None:
            return mode.plain(cat.counts, cat.lengths, c, epoch, segments, lambda w: self.config_at(w).window_samples)
        sc = self.sources
        # a mix's windows (J = samples // window_samples) keep the epoch's first world's size across resizes
        window = self.config_at(segments[0][0]).window_samples if segments else c.window_samples
        inputs = mixed_inputs(sc, window, c.seed, epoch, c.shuffle)
        return mode.mixed(inputs, c, epoch, segments, lambda ids: source_of_shards(sc, ids), sc.mix.num_sources)

    def summary(self, epoch: int, segments: Segments = ()) -> EpochSummary:
        """Steps, samples, padding and drops of an epoch after ``segments``,
        planned from the catalog's lengths only. Cached per (epoch, segments)."""
        key = (epoch, segments)
        if key not in self._summaries:
            if self.sources is None and not segments:
                summary = summarize(self.catalog.counts, self.catalog.lengths, self.config, epoch)
            else:
                summary = summarize_windows(self.windows(epoch, segments), self.samples_per_epoch, epoch,
                                            self.config, sum(k for _, k in segments))
            if summary.too_long and not self._summaries:  # once per dataset, not per epoch
                log.warning("StreamingBatches: %d of %d samples are longer than max_length=%d and are left out",
                            summary.too_long, self.catalog.num_samples, self.config.max_length)
            self._summaries[key] = summary
        return self._summaries[key]
