"""``StreamingBatches``: the torch glue over sidecars, window plans and tar reads.

The class is split by job: constructor-time setup in ``streaming/pipeline/setup.py``,
state and resume in ``streaming/pipeline/state.py``, the reading generator in
``streaming/pipeline/reading.py``; this module holds the class, its epochs and sizes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, Literal

import numpy as np
from torch.utils.data import IterableDataset

from ..core.config import check_epoch
from ..core.long_samples import check_max_length
from ..core.plan import config_fingerprint
from ..core.redact import logger, scrub_exception
from ..core.types import FlagLike, IntLike, LengthFrom, NumberLike, UrlsLike
from ..core.validation import check_flag, check_int
from ..planners import RECOMMENDED
from ..planners.elastic import Segments
from ..torch_glue.distributed import agree, guess_world, is_distributed, resolve_world, will_check
from ..torch_glue.elastic import SharedSegments
from ..torch_glue.guard import check_not_prepared
from .epoch.modes import READ_MODES, summarize
from .epoch.sample_mode import summarize_windows
from .epoch.windows import EpochSummary, Window, WindowConfig, default_window
from .formats.audio import decode_audio
from .io.remote_io import RemoteIO, check_identity
from .io.retry import RetryPolicy, as_policy
from .pipeline.reading import ReadingMixin
from .pipeline.setup import (
    check_output,
    check_samples,
    check_verify,
    index_missing_shares,
    open_shards,
    resolve_read_mode,
    warm_up,
)
from .pipeline.state import StateMixin
from .runtime.counters import SharedState
from .runtime.failures import open_channel
from .shards.catalog_trust import check_trust
from .shards.sources import Source, SourceCatalog, is_sources, mixed_inputs, source_of_shards

log = logger("streambatch.streaming")


class StreamingBatches(StateMixin, ReadingMixin, IterableDataset):
    """Balanced token-budget batches streamed from WebDataset tar shards.

    Each item is one batch: rank ``rank``'s share of one global step, a list
    of webdataset-style sample dicts (``__key__``, ``__url__`` and the raw
    bytes of each member by suffix), or ``collate_fn(batch)``. Every rank
    yields the same number of batches per epoch, ``len(self)``, and every
    sample is delivered once per epoch across ranks, except the counted
    padding (``drop_last=False``) or drop (``drop_last=True``) of the final
    step (see ``epoch_summary``).

    Use with ``DataLoader(ds, batch_size=None, num_workers=N)`` and call
    ``set_epoch(e)`` before each epoch. Worker ``w`` of ``N`` yields the
    rank's steps ``w, w + N, ...``; the DataLoader's in-order round robin
    restores step order, so the output does not depend on ``num_workers``.

    urls: brace pattern, path or list of shard URLs; each needs a sidecar
        (``streambatch index``), or pass ``index_missing=True`` for local files.
        Or a list of ``Source(urls, weight=...)`` to mix several corpora: each
        epoch takes every source's quota, read in cycles (every sample once
        per cycle), and each window holds the sources in proportion (see
        ``sources.py``; sample read mode).
    samples_per_epoch: with weighted sources, samples per epoch (default:
        the sum of the sources' samples).
    max_batch_tokens, max_batch_size, planner, **planner_options: as for
        ``make_plan``; each window is planned with them. The planner defaults
        to ``"bucketed"`` (streaming has no seed sampler to reproduce, and it
        balances and pads best; ``DynamicBatchSampler`` keeps ``"greedy"``).
    max_length, long_samples: samples longer than ``max_length`` (length
        units, as in the sidecars) are never planned nor read
        (``long_samples="drop"``: counted in ``num_too_long`` and
        ``epoch_summary().too_long``, and logged) or make the constructor raise
        naming the shard (``"raise"``; it reads every sidecar once). None
        (default): no limit.
    window_samples: samples per planning window (consecutive shards are
        grouped until they hold this many). Larger windows shuffle more widely
        and balance better; memory is one window's sidecar arrays (~50 bytes
        per sample) per process. The default (None: 20,000; in shard mode
        max(20,000, 2,500 x W)) balances steps at >= 0.95 for audio-like
        lengths.
    read_mode: ``"sample"`` (each window planned across all ranks; a rank
        reads its own samples by offset: for local files, where seeks are
        free), ``"shard"`` (each rank trains on a contiguous piece of the
        window's shards, which it alone streams: each byte crosses the
        network once per epoch across the job; see ``streaming/epoch/affinity/plan.py``) or None
        (the default): ``"sample"`` when every URL (of every source, for
        a mix) is a local file, ``"shard"`` otherwise. Shard mode plans with its own walk: ``planner``
        is not used there, and ``planner_options`` are the bucketed
        planner's (``cost``, ``max_step_cost``).
    rank, world_size: default to ``torch.distributed`` when initialised, else
        0/1 (an error when a launcher started several processes, or with
        ``rank=None`` and ``world_size > 1``).
    length_from, frames_per_second: how lengths are computed when indexing on
        the fly; if given, sidecars made another way count as stale.
    decode: None (raw bytes), ``"audio"`` (audio -> (float32 tensor (C, T),
        sample_rate), json -> object, txt -> str) or a function of a sample.
    on_error: ``"raise"`` (default) or ``"skip"``: a sample that cannot be
        read or decoded is logged, counted in ``num_skipped`` and left out of
        its batch; the batch is still yielded (possibly empty), so every rank
        takes the same steps.
    verify: when ``torch.distributed`` is initialised and world_size > 1,
        all-reduce a fingerprint of shards, sidecars and config at
        construction and raise on every rank if any rank differs or failed
        to build its dataset; a main-process ``load_state_dict`` checks the same way that all ranks
        resume at the same position. No other
        collectives, none in DataLoader workers. ``"full"`` also re-hashes
        every shard and compares it with the content digest taken when it was
        indexed (catches any edit; reads every byte once), instead of the cheap
        size/mtime check. Remote shards are checked against the size and ETag
        recorded at indexing (each rank checks 1/W of them) unless False.
    storage_options, cache_dir, prefetch_shards, prefetch_bytes, retry:
        remote shards (``s3://``, ``gs://``, ``https://``, ``hf://``, ``pipe:``;
        ``urls`` may be a ``*.catalog.npz`` written by ``streambatch index``):
        fsspec options (never logged), the node-local cache directory, how many
        shard ranges (bytes) to download ahead per worker, and the
        ``RetryPolicy`` (or a number of retries); see ``remote_io.RemoteIO``.
    trust_catalog: the entries of a catalog file are data: by default a
        ``pipe:`` entry is refused, and a catalog in remote storage may list
        only URLs of that storage (no local paths). True lifts this for a
        catalog you wrote yourself (a ``pipe:`` entry runs a shell command);
        a set of schemes (``{"pipe"}``) allows just those
        (``streaming/shards/catalog_trust.py``).
    """

    def __init__(self, urls: UrlsLike | Source | Sequence[Source], max_batch_tokens: NumberLike,
                 max_batch_size: IntLike = 64, *, window_samples: IntLike | None = None,
                 read_mode: str | None = None, shuffle: FlagLike = True, drop_last: FlagLike = False,
                 seed: IntLike = 42, rank: IntLike | None = None, world_size: IntLike | None = None,
                 planner: str = RECOMMENDED, index_dir: str | None = None, index_missing: bool = False,
                 length_from: LengthFrom | None = None, frames_per_second: float | None = None,
                 index_workers: IntLike | None = 1,
                 decode: Literal["audio"] | Callable[[dict[str, Any]], Any] | None = None,
                 collate_fn: Callable[[list[Any]], Any] | None = None, on_error: str = "raise",
                 verify: bool | str = True, max_length: IntLike | None = None, long_samples: str = "drop",
                 samples_per_epoch: IntLike | None = None, storage_options: dict[str, Any] | None = None,
                 cache_dir: str | None = None, prefetch_shards: IntLike = 4, prefetch_bytes: IntLike | None = None,
                 retry: RetryPolicy | int | None = None, trust_catalog: bool | Collection[str] = False,
                 **planner_options: Any) -> None:
        super().__init__()
        failure: BaseException | None = None
        world: Any = world_size  # the caller's value until resolve_world checks it
        self.sources: SourceCatalog | None = None
        self._auto_window = window_samples is None  # then it follows the world size (elastic resume)
        mixed = False
        try:
            mixed = is_sources(urls)
            if samples_per_epoch is not None and not mixed:
                raise ValueError("samples_per_epoch applies to a mix of Source(...) entries; with one shard list "
                                 "every sample is trained once per epoch")
            index_missing = check_flag("index_missing", index_missing)
            self.verify, verify_shards = check_verify(verify)
            self.rank, world = resolve_world(rank, world_size)
            max_length, long_samples = check_max_length(max_length, long_samples)
            trust = check_trust(trust_catalog)
            policy = as_policy(retry)  # its timeout bounds every request made here, catalog reads included
            read_mode = resolve_read_mode(urls, read_mode, mixed, storage_options, trust, policy)
            if window_samples is None:
                window_samples = default_window(read_mode, world)
            self.config = WindowConfig.build(max_batch_tokens, max_batch_size, world, shuffle, drop_last, seed,
                                             planner, planner_options, window_samples=window_samples,
                                             read_mode=read_mode, max_length=max_length)
            check_output(on_error, decode, collate_fn)
            warm_up(self.config, world)
        except Exception as exc:  # re-raised below, after every rank has heard of it
            failure = exc
        if index_missing not in (False, 0, None) and is_distributed() and guess_world(world) > 1:
            # Each rank indexes its share; the agreement doubles as the barrier
            # after it, and carries any rank's failure to all ranks.
            if failure is None:
                try:
                    index_missing_shares(urls, mixed, self.rank, world, index_dir, length_from, frames_per_second,
                                         index_workers)
                except Exception as exc:
                    failure = exc
            agree({"fingerprint": 0}, "indexing the missing shards", failure)
        if failure is None:
            try:
                self.sources, self.catalog = open_shards(
                    urls, mixed=mixed, samples_per_epoch=samples_per_epoch, index_dir=index_dir,
                    index_missing=index_missing, length_from=length_from, frames_per_second=frames_per_second,
                    index_workers=index_workers, verify_shards=verify_shards, storage_options=storage_options,
                    trust_catalog=trust, retry=policy)
                if self.verify:  # remote shards changed since indexing: fail now, not mid-epoch
                    check_identity(self.catalog, self.rank, world, storage_options, policy)
                self.remote = RemoteIO.for_catalog(self.catalog, self.rank, storage_options=storage_options,
                                                   cache_dir=cache_dir, prefetch_shards=prefetch_shards,
                                                   prefetch_bytes=prefetch_bytes, retry=retry, world_size=world,
                                                   window_samples=self.config.window_samples,
                                                   read_mode=self.config.read_mode)
                self.fingerprint = self.fingerprint_at(world)
                check_samples(self.catalog, self.config.max_length, long_samples)
            except Exception as exc:
                failure = exc
        if failure is not None:
            scrub_exception(failure)  # a backend's exception may quote a URL with its credentials
        if will_check(verify, world):
            agree({"fingerprint": 0 if failure else self.fingerprint},
                  "the streaming plan (shard list, sidecars or streaming settings)", failure)
        elif failure is not None:
            raise failure
        self.world_size = world
        # a fatal read error mid-epoch reaches every rank through torch.distributed's store (failures.py)
        self._failures = open_channel(self.fingerprint, self.rank, world)
        self.decode = decode_audio if decode == "audio" else decode
        self.collate_fn = collate_fn
        self.on_error = on_error
        self._shared = SharedState()
        self._segments = SharedSegments()  # the elastic history of a resumed epoch
        self._summaries: dict[tuple[int, Segments], EpochSummary] = {}
        self._pos: dict[str, Any] | None = None
        self._local_resume: dict[str, Any] | None = None
        self._slot = 0  # this process's skip counter: the main process's, or a worker's (set per pass)
        self.bytes_read = 0  # tar bytes this process read (files and streams)

    def config_at(self, world_size: int) -> WindowConfig:
        """This dataset's config as a run at ``world_size`` built it (the
        default ``window_samples`` of shard mode depends on the world size)."""
        c = self.config
        auto = getattr(self, "_auto_window", False)  # (datasets pickled before it existed)
        window = default_window(c.read_mode, world_size) if auto else c.window_samples
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

    def source_positions(self, epoch: IntLike | None = None) -> list[tuple[int, int]]:
        """Mixing: per source, (cycle, sample position in it) at the start of
        an epoch (default: the current one)."""
        epoch = self.epoch if epoch is None else check_epoch(epoch)
        return self.sources.mix.positions(epoch) if self.sources is not None else [(epoch, 0)]

    def _windows(self, epoch: int, segments: Segments = ()) -> Iterator[Window]:
        """The epoch's planned windows, at this world size after ``segments``."""
        mode = READ_MODES[self.config.read_mode]
        if self.sources is None and not segments:
            return mode.plain(self.catalog.counts, self.catalog.lengths, self.config, epoch)
        if self.sources is None:
            return mode.plain(self.catalog.counts, self.catalog.lengths, self.config, epoch, segments,
                              lambda w: self.config_at(w).window_samples)
        sc = self.sources
        c = self.config
        # a mix's windows (J = samples // window_samples) keep the epoch's first world's size across resizes
        window = self.config_at(segments[0][0]).window_samples if segments else c.window_samples
        inputs = mixed_inputs(sc, window, c.seed, epoch, c.shuffle)
        return mode.mixed(inputs, c, epoch, segments, lambda ids: source_of_shards(sc, ids), sc.mix.num_sources)

    # ------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        return self._shared.epoch

    def set_epoch(self, epoch: IntLike) -> None:
        """Select the epoch the next pass plans (shard order and windows)."""
        check_not_prepared(self)  # accelerate's prepared loaders call this; they would re-split our batches
        self._shared.epoch = check_epoch(epoch)

    def set_start_batch(self, start: IntLike) -> None:
        """Make the next pass over the current epoch start at this rank's
        ``start``-th batch (for resuming from a step count you saved). Only
        the next pass: later passes over the epoch start from its beginning."""
        base = sum(k for _, k in self._segments.get(self.epoch))
        start = check_int("start", start, base, len(self))
        self._shared.set_resume(self.epoch, start)
        self._pos = None

    def epoch_summary(self, epoch: IntLike | None = None) -> EpochSummary:
        """Steps, samples, padding and drops of an epoch, planned from the
        sidecars' lengths only (no tar is read). Cached per epoch."""
        epoch = self.epoch if epoch is None else check_epoch(epoch)
        return self._summary(epoch, self._segments.get(epoch))

    def _summary(self, epoch: int, segments: Segments) -> EpochSummary:
        if (epoch, segments) not in self._summaries:
            if self.sources is None and not segments:
                summary = summarize(self.catalog.counts, self.catalog.lengths, self.config, epoch)
            else:
                summary = summarize_windows(self._windows(epoch, segments), self.samples_per_epoch, epoch)
            if summary.too_long and not self._summaries:  # once per dataset, not per epoch
                log.warning("StreamingBatches: %d of %d samples are longer than max_length=%d and are left out",
                            summary.too_long, self.catalog.num_samples, self.config.max_length)
            self._summaries[(epoch, segments)] = summary
        return self._summaries[(epoch, segments)]

    @property
    def num_too_long(self) -> int:
        """Samples longer than ``max_length``, left out of every epoch."""
        return self.epoch_summary().too_long

    def __len__(self) -> int:
        """Batches this rank (every rank) yields in the current epoch."""
        return self.epoch_summary().steps

    @property
    def num_skipped(self) -> int:
        """Samples skipped so far (``on_error="skip"``) by this rank: the main
        process and all its DataLoader workers, continued from a loaded state."""
        return self._shared.skipped()

    def __repr__(self) -> str:
        c = self.config
        return (f"StreamingBatches({len(self.catalog.urls)} shards, {self.catalog.num_samples} samples, "
                f"max_batch_tokens={c.max_batch_tokens}, max_batch_size={c.max_batch_size}, "
                f"rank={self.rank}, world_size={self.world_size}, window_samples={c.window_samples}, "
                f"read_mode={c.read_mode!r}, "
                f"epoch={self.epoch})")
