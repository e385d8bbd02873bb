"""The epoch plan: a dataset's epochs as planned windows, at the world size of each elastic segment.

``EpochPlan`` is the plan layer's one object for both classes of the glue: ``StreamingBatches`` holds one over
shards (``ShardSource``: a catalog, or a mix of shard lists, cut into windows by the read mode's strategy,
``read_modes.ReadMode``, resolved once) and ``DynamicBatchSampler`` one over lengths in memory
(``in_memory.InMemory``: one source, one window). It holds what every epoch is planned from: the source and
the configuration (a ``PlanConfig``, or a ``WindowConfig`` for shards: options resolved once, the batch rule
``config.limits``). ``windows(epoch, segments)`` is the stream a pass reads; ``summary`` plans an epoch from
lengths only (no tar is read) and is cached. Pure numpy, no torch, no I/O beyond the catalog's lengths, so
every rank and worker computes the same windows.

Stream: ``Window`` objects of one epoch (a window's plan and each rank's reads), in step order."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from ..core.config import PlanConfig
from ..core.plan import config_fingerprint
from ..core.redact import logger
from .elastic import Segments
from .in_memory import InMemory
from .mixed_windows import mixed_inputs, source_of_shards
from .read_modes import ReadMode
from .windows import EpochSummary, MixedShards, ShardCatalog, Window, WindowConfig, summarize_windows

log = logger("streambatch.streaming")


class EpochSource(Protocol):
    """What an ``EpochPlan`` plans from (``ShardSource`` or ``InMemory``)."""

    @property
    def samples_per_epoch(self) -> int: ...

    def positions(self, epoch: int) -> list[tuple[int, int]]: ...

    def config_at(self, config: Any, world_size: int) -> Any: ...

    def fingerprint(self, config: Any) -> int: ...

    def windows(self, config: Any, epoch: int, segments: Segments) -> Iterator[Window]: ...


@dataclasses.dataclass(frozen=True)
class ShardSource:
    """Shards as an epoch's source: catalog: every shard (a mix's shards, source after source); sources: the
    mix, or None for one shard list; mode: the read mode's strategy; auto_window: ``window_samples`` was not
    given, so it follows the world size (``mode.default_window``) when an elastic history names another world."""

    catalog: ShardCatalog
    sources: MixedShards | None
    mode: ReadMode
    auto_window: bool

    @property
    def samples_per_epoch(self) -> int:
        """Samples an epoch plans: the mix's quotas, or every sample once."""
        return self.sources.mix.samples_per_epoch if self.sources is not None else self.catalog.num_samples

    def positions(self, epoch: int) -> list[tuple[int, int]]:
        """Per source, (cycle, sample position in it) at the start of ``epoch``."""
        return self.sources.mix.positions(epoch) if self.sources is not None else [(epoch, 0)]

    def config_at(self, config: WindowConfig, world_size: int) -> WindowConfig:
        window = self.mode.default_window(world_size) if self.auto_window else config.window_samples
        return dataclasses.replace(config, world_size=world_size, window_samples=window)

    def fingerprint(self, config: WindowConfig) -> int:
        fp = config.fingerprint(self.catalog.fingerprint())
        if self.sources is not None:
            mix = self.sources.mix
            fp = config_fingerprint(np.array(mix.sizes + mix.counts + tuple(self.sources.bounds.tolist()),
                                             dtype=np.int64), fp)
        return fp

    def windows(self, config: WindowConfig, epoch: int, segments: Segments) -> Iterator[Window]:
        mode, cat = self.mode, self.catalog
        if self.sources is None and not segments:
            return mode.plain(cat.counts, cat.lengths, config, epoch)
        if self.sources is None:
            return mode.plain(cat.counts, cat.lengths, config, epoch, segments,
                              lambda w: self.config_at(config, w).window_samples)
        sc = self.sources
        # a mix's windows (J = samples // window_samples) keep the epoch's first world's size across resizes
        window = self.config_at(config, segments[0][0]).window_samples if segments else config.window_samples
        inputs = mixed_inputs(sc, window, config.seed, epoch, config.shuffle)
        return mode.mixed(inputs, config, epoch, segments, lambda ids: source_of_shards(sc, ids), sc.mix.num_sources)


class EpochPlan:
    """Every epoch of one dataset, window by window.

    source: what is planned (``ShardSource`` or ``InMemory``); config: its
    ``world_size`` is this run's.
    """

    def __init__(self, source: EpochSource, config: PlanConfig):
        self.source, self.config = source, config
        self._summaries: dict[tuple[int, Segments], EpochSummary] = {}

    @classmethod
    def over_shards(cls, catalog: ShardCatalog, sources: MixedShards | None, config: WindowConfig, mode: ReadMode,
                    auto_window: bool) -> EpochPlan:
        """A streaming dataset's epochs (see ``ShardSource``)."""
        return cls(ShardSource(catalog, sources, mode, auto_window), config)

    @classmethod
    def in_memory(cls, lengths: np.ndarray, config: PlanConfig, **kwargs: Any) -> EpochPlan:
        """A map-style sampler's epochs (see ``InMemory``: ``mix``, ``keep``, ``max_length``, ``long_samples``)."""
        return cls(InMemory(lengths, **kwargs), config)

    @property
    def catalog(self) -> ShardCatalog:
        """The shards' catalog (a streaming dataset's plan)."""
        return self._shards().catalog

    @property
    def sources(self) -> MixedShards | None:
        """The mix of shard lists, or None (a streaming dataset's plan)."""
        return self._shards().sources

    def _shards(self) -> ShardSource:
        if not isinstance(self.source, ShardSource):
            raise TypeError("this epoch plan is over lengths in memory, not shards")
        return self.source

    def config_at(self, world_size: int) -> Any:
        """The config as a run at ``world_size`` built it (the default
        ``window_samples`` of shard mode depends on the world size)."""
        return self.source.config_at(self.config, world_size)

    def fingerprint_at(self, world_size: int) -> int:
        """The state fingerprint of this data and these settings at ``world_size``."""
        return self.source.fingerprint(self.config_at(world_size))

    @property
    def samples_per_epoch(self) -> int:
        """Samples an epoch plans: the mix's quotas, or every sample once."""
        return self.source.samples_per_epoch

    def source_positions(self, epoch: int) -> list[tuple[int, int]]:
        """Per source, (cycle, sample position in it) at the start of ``epoch``."""
        return self.source.positions(epoch)

    def windows(self, epoch: int, segments: Segments = ()) -> Iterator[Window]:
        """The epoch's planned windows, at this world size after ``segments``
        (the finished ``(world_size, steps)`` runs of an elastic resume)."""
        return self.source.windows(self.config, epoch, segments)

    def summary(self, epoch: int, segments: Segments = ()) -> EpochSummary:
        """Steps, samples, padding and drops of an epoch after ``segments``,
        and the fewest steps its samples can take (``EpochSummary.fewest_steps``),
        planned from lengths only. Cached per (epoch, segments)."""
        key = (epoch, segments)
        if key not in self._summaries:
            summary = summarize_windows(self.windows(epoch, segments), self.samples_per_epoch, epoch, self.config,
                                        sum(k for _, k in segments))
            if summary.too_long and not self._summaries:  # once per dataset, not per epoch
                rule = self.config.limits
                over = [f"max_length={rule.max_length}"] if rule.max_length is not None else []
                if rule.long_samples == "drop":
                    over.append(f"max_batch_tokens={rule.max_batch_tokens} (long_samples='drop')")
                log.warning("StreamingBatches: %d of %d samples are longer than %s and are left out",
                            summary.too_long, self.catalog.num_samples, " or ".join(over))
            self._summaries[key] = summary
        return self._summaries[key]
