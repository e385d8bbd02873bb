"""``StreamingBatches``: the torch ``IterableDataset`` that wires the streaming stages.

Constructor: options (``options.py``) -> shard lists, URLs expanded once (``shards/lists.py``) -> the read mode's
strategy (``epoch/read_modes.py``) -> catalog (``shards/catalog.py``) -> epoch plan (``epoch/epoch_plan.py``, the
plan layer). Each pass: windows -> this rank's steps (``pipeline/steps.py``) -> byte reads (``pipeline/reads.py``)
-> samples, decode, skip (``pipeline/samples.py``) -> collate.

Stream: batches: this rank's (and DataLoader worker's) steps of the epoch, in step order."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, Literal

from torch.utils.data import IterableDataset, get_worker_info

from ..core.config import check_epoch
from ..core.keywords import REQUIRED
from ..core.long_samples import check_max_length
from ..core.redact import scrub_exception
from ..core.types import FlagLike, IntLike, LengthFrom, NumberLike, UrlsLike
from ..core.validation import check_int
from ..epoch.epoch_plan import EpochPlan
from ..epoch.read_modes import resolve_mode
from ..epoch.windows import EpochSummary, WindowConfig
from ..planners import RECOMMENDED
from ..torch_glue.distributed import agree, guess_world, is_distributed, resolve_world, will_check
from ..torch_glue.guard import check_not_prepared
from .io.remote_io import RemoteIO, check_identity
from .io.retry import RetryPolicy
from .options import IndexSettings, Options, OutputSettings, RemoteSettings, ungroup
from .pipeline.preflight import PreflightReport, preflight_streaming
from .pipeline.reads import SampleReads
from .pipeline.samples import collate, decode, keep_read, parse
from .pipeline.state import ordered_state, resume
from .pipeline.steps import Cursor, Progress
from .runtime.failures import open_channel, watched
from .shards.lists import ShardLists, check_samples
from .shards.sources import Source


class StreamingBatches(IterableDataset):
    """Balanced token-budget batches streamed from WebDataset tar shards.

    Each item is one batch: rank ``rank``'s share of one global step, a list of webdataset-style sample dicts
    (``__key__``, ``__url__`` and the raw bytes of each member by suffix), or ``collate_fn(batch)``. Every rank
    yields ``len(self)`` batches per epoch and every sample is delivered once per epoch across ranks, except the
    counted padding (``drop_last=False``) or drop (``drop_last=True``) of the final step (``epoch_summary``).
    Use with ``DataLoader(ds, batch_size=None, num_workers=N)`` and call ``set_epoch(e)`` before each epoch;
    worker ``w`` of ``N`` yields the rank's steps ``w, w + N, ...``, so the output does not depend on ``N``.

    urls: brace pattern, path or list of shard URLs, each with a sidecar (``streambatch index``; or
        ``index_missing=True`` for local files); or a ``*.catalog.npz`` written by ``streambatch index`` (remote
        shards: ``s3://``, ``gs://``, ``https://``, ``hf://``, ``pipe:``); or a list of ``Source(urls,
        weight=...)`` to mix corpora: each epoch takes every source's quota, read in cycles, each window holding
        the sources in proportion (``shards/sources.py``); ``samples_per_epoch``: a weighted mix's epoch size.
        Other corpus formats (``shards/corpora/``) are read where they are: a Lhotse Shar directory, a NeMo
        tarred manifest, Parquet files, or their spec objects (``Shar(...)``, ``NemoTarred(...)``,
        ``Parquet(...)``); their lengths come from their own metadata (``length_from``, default
        ``json:duration`` for Shar and NeMo, ``column:duration`` for Parquet; seconds need
        ``frames_per_second``).
    format: the corpus format of ``urls`` (``"webdataset"``, ``"shar"``, ``"nemo"``, ``"parquet"``), or None:
        detected from what ``urls`` is (a Source may name its own).
    max_batch_tokens, max_batch_size, shuffle, drop_last, planner, **planner_options: as for ``make_plan`` and
        ``DynamicBatchSampler`` (the same names; shuffle, drop_last, rank, world_size, seed in the sampler's order),
        per window. The planner defaults to ``"bucketed"`` (it balances and pads best; ``DynamicBatchSampler``
        keeps the seed's ``"greedy"``).
    rank, world_size: default to ``torch.distributed`` when initialised, else 0/1 (an error when a launcher started
        several processes, or with ``rank=None`` and ``world_size > 1``).
    max_length, long_samples: samples longer than ``max_length`` (sidecar length units) are never planned nor read
        (counted in ``num_too_long``, logged). Samples longer than the budget alone: ``"warn"`` (default) plans
        each alone, over the budget, with one ``LongSampleWarning`` per dataset (at construction, in each
        process that builds it: every rank once) giving their count, the longest and the fix; ``"drop"``
        leaves them out too (counted, warned); ``"raise"`` makes the constructor raise for either kind, naming
        the shard (``core/long_samples.py``).
    verify: under torch.distributed with world_size > 1, all ranks check at construction (and in a main-process
        ``load_state_dict``) that they built the same dataset and resume alike; ``"full"`` also re-hashes every
        shard against its indexed digest; remote shards are checked against their indexed size and ETag unless False
        (``options.Checks``).
    window_samples: samples planned together (consecutive shards until they hold this many): larger windows shuffle
        wider and balance better; memory is ~50-80 bytes per sample of one window (measured: a 1.28M-sample
        window, W = 512, peaks ~105 MB above 20,000-sample windows). Default max(20,000, 2,500 x W)
        in both read modes (every rank's share the same at any W: small windows of few steps each cost the epoch
        steps or balance).
    read_mode: ``"sample"`` (each window planned across all ranks; a rank reads its samples by offset: local
        files), ``"shard"`` (each rank trains a contiguous piece of the window's shards, which it alone streams:
        each byte crosses the network once per epoch; the bucketed planner's options) or None: ``"sample"`` when
        every URL is a local file, else ``"shard"`` (``epoch/read_modes.py``).
    index, remote, output: the settings below grouped by what they are for, as ``IndexSettings``,
        ``RemoteSettings`` and ``OutputSettings`` with the same field names (``remote=RemoteSettings(cache_dir=...,
        storage_options=...)``); the flat keywords work as well, and one given both ways raises.
    index_dir, index_missing, length_from, frames_per_second, index_workers: where sidecars are, and how missing
        local ones are indexed (``shards/lists.IndexOptions``).
    storage_options, cache_dir, prefetch_shards, prefetch_bytes, retry, trust_catalog: remote shards: fsspec options
        (never logged), the node-local cache root, downloads ahead per worker, the ``RetryPolicy`` (or a number of
        retries), what a catalog file may list (``io/remote_io.RemoteOptions``).
    decode, collate_fn, on_error: None (raw bytes), ``"audio"`` or a function of a sample; a function of the batch;
        ``"raise"`` or ``"skip"``: a sample that cannot be read or decoded is counted in ``num_skipped`` and left
        out of its batch, which is still yielded (``pipeline/samples.OutputOptions``).
    """

    def __init__(self, urls: UrlsLike | Source | Sequence[Source], max_batch_tokens: NumberLike = REQUIRED,
                 max_batch_size: IntLike = 64, *, shuffle: FlagLike = True, drop_last: FlagLike = False,
                 rank: IntLike | None = None, world_size: IntLike | None = None, seed: IntLike = 42,
                 planner: str = RECOMMENDED, verify: bool | str = True, max_length: IntLike | None = None,
                 long_samples: str = "warn", window_samples: IntLike | None = None, read_mode: str | None = None,
                 samples_per_epoch: IntLike | None = None, format: str | None = None,
                 index: IndexSettings | None = None, remote: RemoteSettings | None = None,
                 output: OutputSettings | None = None,
                 index_dir: str | None = None, index_missing: bool = False,
                 length_from: LengthFrom | None = None, frames_per_second: float | None = None,
                 index_workers: IntLike | None = 1,
                 decode: Literal["audio"] | Callable[[dict[str, Any]], Any] | None = None,
                 collate_fn: Callable[[list[Any]], Any] | None = None, on_error: str = "raise",
                 storage_options: dict[str, Any] | None = None,
                 cache_dir: str | None = None, prefetch_shards: IntLike = 4, prefetch_bytes: IntLike | None = None,
                 retry: RetryPolicy | int | None = None, trust_catalog: bool | Collection[str] = False,
                 **planner_options: Any) -> None:
        super().__init__()
        failure: BaseException | None = None
        world: Any = world_size  # the caller's value until resolve_world checks it
        self.sources = None
        # the settings as flat keywords, a setting object's fields filled in (index=, remote=, output=)
        s = dict(index_dir=index_dir, index_missing=index_missing, length_from=length_from,
                 frames_per_second=frames_per_second, index_workers=index_workers, storage_options=storage_options,
                 cache_dir=cache_dir, prefetch_shards=prefetch_shards, prefetch_bytes=prefetch_bytes, retry=retry,
                 trust_catalog=trust_catalog, decode=decode, collate_fn=collate_fn, on_error=on_error)
        try:
            s = ungroup({"index": index, "remote": remote, "output": output}, s)
            lists = ShardLists(urls, samples_per_epoch=samples_per_epoch, index_dir=s.pop("index_dir"),
                                format=format)
            self.options = o = Options.build(verify=verify, **s)
            self.verify = o.checks.ranks
            self.rank, world = resolve_world(rank, world_size)
            max_length, long_samples = check_max_length(max_length, long_samples)
            mode = resolve_mode(read_mode, lambda: lists.all_local(o.remote))  # the read mode's strategy, once
            window = mode.default_window(world) if window_samples is None else window_samples
            self.config = WindowConfig.build(max_batch_tokens, max_batch_size, world, shuffle, drop_last, seed,
                                             planner, planner_options, long_samples, window_samples=window,
                                             read_mode=mode.name, max_length=max_length)
            mode.warm_up(self.config, world)  # DataLoader workers forked later inherit the loaded planner
        except Exception as exc:  # re-raised below, after every rank has heard of it
            failure = exc
        if s["index_missing"] not in (False, 0, None) and is_distributed() and guess_world(world) > 1:
            # Each rank indexes its share; the agreement doubles as the barrier after it, and carries any
            # rank's failure to all ranks.
            if failure is None:
                try:
                    lists.index_shares(self.rank, world, o.index, o.remote)
                except Exception as exc:
                    failure = exc
            agree({"fingerprint": 0}, "indexing the missing shards", failure)
        if failure is None:
            try:
                # Catalog: every shard's URL, sidecar and sample lengths (a mix's sources, source after source)
                self.sources, self.catalog = lists.open(o.index, o.remote)
                if o.checks.remote:  # remote shards changed since indexing: fail now, not mid-epoch
                    check_identity(self.catalog, self.rank, world, o.remote.storage_options, o.remote.retry)
                self.remote = RemoteIO.for_catalog(self.catalog, self.rank, o.remote, world,
                                                   self.config.window_samples, mode.rank_share)
                self.plan = EpochPlan.over_shards(self.catalog, self.sources, self.config, mode, window_samples is None)
                self.fingerprint = self.plan.fingerprint_at(world)
                # raises under "raise"; one LongSampleWarning per dataset (per process: each rank builds one,
                # DataLoader workers copy it) for samples over the budget, planned alone or left out
                check_samples(self.catalog, self.config.max_length, long_samples, self.config.max_batch_tokens)
            except Exception as exc:
                failure = exc
        if failure is not None:
            scrub_exception(failure)  # a backend's exception may quote a URL with its credentials
        if will_check(verify, world):
            agree({"fingerprint": 0 if failure else self.fingerprint},
                  "the streaming plan (shard list, sidecars or streaming settings)", failure,
                  layout=(getattr(self, "rank", 0), world))  # who is which rank, too (ignored if this rank failed)
        elif failure is not None:
            raise failure
        self.world_size = world
        self.progress = Progress(self.fingerprint)  # epoch, resume, elastic history, skips: shared with workers
        # a fatal read error mid-epoch reaches every rank through torch.distributed's store (failures.py)
        self._failures = open_channel(self.fingerprint, self.rank, world)
        self.bytes_read = 0  # tar bytes this process read (files and the cache)

    # ------------------------------------------------------------ a pass

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        return self._pass(self.progress.begin(*((None, 0) if info is None else (info.id, info.num_workers))))

    def _pass(self, cursor: Cursor) -> Iterator[Any]:
        out = self.options.output
        # Remote shards: byte ranges downloaded whole into a node-local cache, read by offset (io/remote_reader.py)
        remote = self.remote.reader(self.catalog, self.rank, cursor.worker or 0, cursor.stride, cursor.start)
        reads = SampleReads(self.catalog, remote, out.on_error)
        windows = self.plan.windows(cursor.epoch, cursor.segments)  # Window: the epoch's planned windows
        mine = cursor.windows(windows, self.rank, peek=remote is not None)  # RankWindow: this worker's steps
        raw = reads.steps(mine, cursor.epoch)  # Step: each step's samples as tar bytes
        samples = decode(parse(raw), out.decode)  # Step: sample dicts, decoded
        kept = keep_read(samples, out.on_error, lambda: self.progress.add_skip(cursor))  # (step, samples read)
        batches = collate(cursor.deliver(kept), out.collate_fn)  # batches; the position moves past each
        try:
            for batch in watched(batches, self._failures, cursor.epoch, cursor.stride):  # one rank fails: all stop
                self.bytes_read = reads.bytes_read
                yield batch
        finally:
            self.bytes_read = reads.bytes_read
            reads.close()

    # ------------------------------------------------------------ epochs and state

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    def set_epoch(self, epoch: IntLike) -> None:
        """Select the epoch the next pass plans (shard order and windows)."""
        check_not_prepared(self)  # accelerate's prepared loaders call this; they would re-split our batches
        self.progress.epoch = check_epoch(epoch)

    def set_start_batch(self, start: IntLike) -> None:
        """Make the next pass over the current epoch start at this rank's
        ``start``-th batch (for resuming from a step count you saved). Only
        the next pass: later passes over the epoch start from its beginning."""
        base = sum(k for _, k in self.progress.segments(self.epoch))
        self.progress.set_start(check_int("start", start, base, len(self)))

    def state_dict(self) -> dict[str, Any]:
        """Position of this process's latest pass (see ``streambatch.core.state``).

        In the main process (``num_workers=0``) ``step`` counts the batches
        yielded and ``skipped`` the samples skipped by the main process and
        its workers. In a DataLoader worker (as torchdata's StatefulDataLoader
        saves it) ``step`` is the next step this worker yields and
        ``skipped`` what this worker skipped. In the main process after
        DataLoader workers began the epoch's pass it warns (RuntimeWarning):
        only they know the position, and this state says the pass's start.
        Then save ``StatefulDataLoader.state_dict()``, or your own step count
        and resume with ``set_start_batch`` (``docs/guide/resume.md``: the
        three ways).
        """
        # epoch, step, worker, num_workers, skipped, elastic history (in the main process: warns if only the
        # DataLoader workers know the position)
        position = self.progress.state_dict(main=get_worker_info() is None)
        sources = self.plan.source_positions(position["epoch"]) if self.sources is not None else None
        return ordered_state(position, self.world_size, self.config, self.fingerprint, sources)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` was saved: the next pass over its epoch
        skips the steps already yielded, planning past them from the sidecar
        lengths without reading their tar data. Everything is checked before
        anything changes (``pipeline/state.py``). In the main process with
        ``verify`` under torch.distributed this is a collective (all ranks
        must resume alike).

        ``state`` is any rank's ``state_dict()`` (they are equal) or, in the
        main process, a torchdata ``StatefulDataLoader.state_dict()``. Saved
        at another world size, the rest of the epoch is planned for this one
        (elastic resume). With DataLoader workers only the loader knows where
        the world stopped: load the loader's state here, in the main process,
        before iterating; restoring it into the loader as well is optional."""
        info = get_worker_info()
        where = (None, 0) if info is None else (info.id, info.num_workers)
        position = resume(state, self.plan, self.progress.segments, info, self.verify, self.fingerprint)
        self.progress.load_state_dict(position, *where)

    def preflight(self, step: Any, epoch: IntLike | None = None, **options: Any) -> PreflightReport:
        """Run an epoch's costliest batches and longest clips (planned from the sidecars' lengths) through
        ``step(batch_size, length)`` before training; raises ``PreflightError`` naming the fix if one does not
        fit. The position is untouched (options: ``torch_glue.preflight.run_preflight``)."""
        return preflight_streaming(self, step, epoch, **options)

    # ------------------------------------------------------------ sizes

    def config_at(self, world_size: int) -> WindowConfig:
        """This dataset's config as a run at ``world_size`` built it."""
        return self.plan.config_at(world_size)

    def fingerprint_at(self, world_size: int) -> int:
        """The state fingerprint of these shards (and sources) and settings at ``world_size``."""
        return self.plan.fingerprint_at(world_size)

    @property
    def samples_per_epoch(self) -> int:
        """Samples an epoch plans: the mix's quotas, or every sample once."""
        return self.plan.samples_per_epoch

    def source_positions(self, epoch: IntLike | None = None) -> list[tuple[int, int]]:
        """Mixing: per source, (cycle, sample position in it) at the start of
        an epoch (default: the current one)."""
        return self.plan.source_positions(self.epoch if epoch is None else check_epoch(epoch))

    def epoch_summary(self, epoch: IntLike | None = None) -> EpochSummary:
        """Steps, samples, padding and drops of an epoch, planned from the
        sidecars' lengths only (no tar is read). Cached per epoch."""
        epoch = self.epoch if epoch is None else check_epoch(epoch)
        return self.plan.summary(epoch, self.progress.segments(epoch))

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
        return self.progress.skipped()

    def __repr__(self) -> str:
        c = self.config
        return (f"StreamingBatches({len(self.catalog.urls)} shards, {self.catalog.num_samples} samples, "
                f"max_batch_tokens={c.max_batch_tokens}, max_batch_size={c.max_batch_size}, "
                f"rank={self.rank}, world_size={self.world_size}, window_samples={c.window_samples}, "
                f"read_mode={c.read_mode!r}, epoch={self.epoch})")
