"""``StreamingBatches``: the torch glue over sidecars, window plans and tar reads."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..core import state as S
from ..core.config import check_epoch
from ..core.long_samples import check_max_length, too_long
from ..core.plan import config_fingerprint
from ..core.validation import check_flag, check_int
from ..integrations.guard import check_not_prepared
from ..planners import RECOMMENDED, plan_epoch
from ..planners.elastic import Segments, resize
from ..torch_glue.distributed import active, agree, guess_world, is_distributed, resolve_world, will_check
from ..torch_glue.elastic import SharedSegments, dataset_state_from_loader, is_loader_state
from .affinity import warm_up as warm_up_affine
from .audio import decode_audio
from .catalog import Catalog, open_catalog
from .catalog_file import catalog_urls, is_catalog
from .errors import ShardError
from .position import SharedState, read_position
from .reader import LocalReader, expand_urls, is_local
from .remote import RetryPolicy
from .remote_io import RemoteIO, check_identity, lookahead
from .replan import plain_inputs, plan_windows, summarize_windows
from .sources import SourceCatalog, is_sources, mixed_inputs, open_sources, source_of_shards
from .tar import parse_sample
from .window import EpochSummary, WindowConfig, check_read_mode, default_window, iter_windows, summarize

log = logging.getLogger("streambatch.streaming")



class StreamingBatches(IterableDataset):
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
        network once per epoch across the job; see ``affinity.py``) or None
        (the default): ``"sample"`` when every URL is a local file,
        ``"shard"`` otherwise. Shard mode plans with its own walk: ``planner``
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
        to build its dataset; a main-process ``load_state_dict`` checks the
        same way that all ranks resume at the same position. No other
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
    """

    def __init__(self, urls: Any, max_batch_tokens: Any, max_batch_size: Any = 64, *,
                 window_samples: Any = None, read_mode: str | None = None, shuffle: bool = True,
                 drop_last: bool = False, seed: Any = 42,
                 rank: Any = None, world_size: Any = None, planner: str = RECOMMENDED,
                 index_dir: str | None = None, index_missing: bool = False, length_from: Any = None,
                 frames_per_second: Any = None, index_workers: Any = 1, decode: Any = None,
                 collate_fn: Callable | None = None, on_error: str = "raise", verify: bool = True,
                 max_length: Any = None, long_samples: str = "drop", samples_per_epoch: Any = None,
                 storage_options: dict | None = None, cache_dir: str | None = None, prefetch_shards: Any = 4,
                 prefetch_bytes: Any = None, retry: Any = None, **planner_options: Any):
        super().__init__()
        failure: BaseException | None = None
        world: Any = world_size
        self.sources: SourceCatalog | None = None
        mixed = False
        try:
            mixed = is_sources(urls)
            if samples_per_epoch is not None and not mixed:
                raise ValueError("samples_per_epoch applies to a mix of Source(...) entries; with one shard list "
                                 "every sample is trained once per epoch")
            index_missing = check_flag("index_missing", index_missing)
            if isinstance(verify, str) and verify != "full":
                raise TypeError(f"verify must be True, False or 'full', got {verify!r}")
            verify_shards = "full" if verify == "full" else "stat"
            self.verify = True if verify_shards == "full" else check_flag("verify", verify)
            rank, world = resolve_world(rank, world_size)
            max_length, long_samples = check_max_length(max_length, long_samples)
            if mixed:
                if read_mode not in (None, "sample"):
                    raise ValueError(f"mixed sources are streamed with read_mode='sample', got {read_mode!r}")
                read_mode = "sample"
            if read_mode is None:
                shard_urls = catalog_urls(urls, storage_options) if is_catalog(urls) else expand_urls(urls)
                read_mode = "sample" if all(is_local(u) for u in shard_urls) else "shard"
            read_mode = check_read_mode(read_mode)
            if window_samples is None:
                window_samples = default_window(read_mode, world)
            self.config = WindowConfig.build(max_batch_tokens, max_batch_size, world, shuffle, drop_last, seed,
                                             planner, planner_options, window_samples=window_samples,
                                             read_mode=read_mode, max_length=max_length)
            if on_error not in ("raise", "skip"):
                raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
            if decode is not None and decode != "audio" and not callable(decode):
                raise ValueError(f"decode must be None, 'audio' or a function of a sample dict, got {decode!r}")
            if collate_fn is not None and not callable(collate_fn):
                raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}")
            # Load the compiled planner now, so DataLoader workers forked later
            # inherit it instead of each loading (or compiling) it again.
            c = self.config
            if read_mode == "shard":
                warm_up_affine(c.max_batch_tokens, c.max_batch_size, world, c.options)
            else:
                plan_epoch(np.ones(world, dtype=np.int64), c, 0)
        except Exception as exc:  # re-raised below, after every rank has heard of it
            failure = exc
        if index_missing not in (False, 0, None) and is_distributed() and guess_world(world) > 1:
            # Each rank indexes its share; the agreement doubles as the barrier
            # after it, and carries any rank's failure to all ranks.
            if failure is None:
                try:
                    for u, d in ([(x.urls, x.index_dir or index_dir) for x in _as_list(urls)] if mixed
                                 else [(urls, index_dir)]):
                        _index_share(u, rank, world, d, length_from, frames_per_second, index_workers)
                except Exception as exc:
                    failure = exc
            agree({"fingerprint": 0}, "indexing the missing shards", failure)
        if failure is None:
            try:
                if mixed:
                    self.sources = open_sources(urls, samples_per_epoch=samples_per_epoch, index_dir=index_dir,
                                                index_missing=index_missing, length_from=length_from,
                                                frames_per_second=frames_per_second, index_workers=index_workers,
                                                verify=verify_shards, storage_options=storage_options)
                    self.catalog: Catalog = self.sources.catalog
                else:
                    self.catalog = open_catalog(
                        urls, index_dir=index_dir, index_missing=index_missing, length_from=length_from,
                        frames_per_second=frames_per_second, index_workers=index_workers,
                        url_hint=urls if isinstance(urls, str) else None, verify=verify_shards,
                        storage_options=storage_options)
                if self.verify:  # remote shards changed since indexing: fail now, not mid-epoch
                    check_identity(self.catalog, rank, world, storage_options,
                                   retry if isinstance(retry, RetryPolicy) else None)
                self.remote = RemoteIO.for_catalog(self.catalog, rank, storage_options=storage_options,
                                                   cache_dir=cache_dir, prefetch_shards=prefetch_shards,
                                                   prefetch_bytes=prefetch_bytes, retry=retry)
                self.fingerprint = self.fingerprint_at(world)
                if self.catalog.num_samples == 0:
                    raise ValueError(f"the {len(self.catalog.urls)} shards hold no samples; check the shard list")
                if long_samples == "raise":
                    for i, url in enumerate(self.catalog.urls):
                        too_long(self.catalog.lengths(i), max_length, long_samples, where=f" of shard {url}")
            except Exception as exc:
                failure = exc
        if will_check(verify, world):
            agree({"fingerprint": 0 if failure else self.fingerprint},
                  "the streaming plan (shard list, sidecars or streaming settings)", failure)
        elif failure is not None:
            raise failure
        self.rank = rank
        self.world_size = world
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

    def fingerprint_at(self, world_size: int) -> int:
        """The state fingerprint of these shards (and sources) and settings at ``world_size``."""
        fp = dataclasses.replace(self.config, world_size=world_size).fingerprint(self.catalog.fingerprint())
        if self.sources is not None:
            mix = self.sources.mix
            fp = config_fingerprint(np.array(mix.sizes + mix.counts + tuple(self.sources.bounds.tolist()),
                                             dtype=np.int64), fp)
        return fp

    @property
    def samples_per_epoch(self) -> int:
        """Samples an epoch plans: the mix's quotas, or every sample once."""
        return self.sources.mix.samples_per_epoch if self.sources is not None else self.catalog.num_samples

    def source_positions(self, epoch: Any = None) -> list[tuple[int, int]]:
        """Mixing: per source, (cycle, sample position in it) at the start of
        an epoch (default: the current one)."""
        epoch = self.epoch if epoch is None else check_epoch(epoch)
        return self.sources.mix.positions(epoch) if self.sources is not None else [(epoch, 0)]

    def _windows(self, epoch: int, segments: Segments = ()):
        """The epoch's planned windows, at this world size after ``segments``."""
        if self.sources is None and not segments:
            return iter_windows(self.catalog.counts, self.catalog.lengths, self.config, epoch)
        if self.sources is None:
            return plan_windows(plain_inputs(self.catalog.counts, self.catalog.lengths, self.config, epoch),
                                self.config, epoch, segments)
        sc = self.sources
        inputs = mixed_inputs(sc, self.config.window_samples, self.config.seed, epoch, self.config.shuffle)
        return plan_windows(inputs, self.config, epoch, segments, lambda ids: source_of_shards(sc, ids),
                            sc.mix.num_sources)

    # ------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        return self._shared.epoch

    def set_epoch(self, epoch: Any) -> None:
        """Select the epoch the next pass plans (shard order and windows)."""
        check_not_prepared(self)  # accelerate's prepared loaders call this; they would re-split our batches
        self._shared.epoch = check_epoch(epoch)

    def set_start_batch(self, start: Any) -> None:
        """Make the next pass over the current epoch start at this rank's
        ``start``-th batch (for resuming from a step count you saved). Only
        the next pass: later passes over the epoch start from its beginning."""
        base = sum(k for _, k in self._segments.get(self.epoch))
        start = check_int("start", start, base, len(self))
        self._shared.set_resume(self.epoch, start)
        self._pos = None

    def epoch_summary(self, epoch: Any = None) -> EpochSummary:
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

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Position of this process's latest pass (see ``streambatch.core.state``).

        In the main process (``num_workers=0``) ``step`` counts the batches
        yielded and ``skipped`` the samples skipped by the main process and
        its workers. In a DataLoader worker (as torchdata's StatefulDataLoader
        saves it) ``step`` is the next step this worker yields and
        ``skipped`` what this worker skipped. With a plain DataLoader and
        workers, save your own step count and use ``set_start_batch``.
        """
        pos = self._pos
        if pos is None or pos["epoch"] != self.epoch:
            pending = self._shared.pending(self.epoch)
            segments = self._segments.get(self.epoch)
            start = pending if pending is not None else sum(k for _, k in segments)
            pos = {"epoch": self.epoch, "step": start, "worker": None, "num_workers": 0, "segments": segments}
        worker = pos["worker"]
        state = {S.VERSION: S.STATE_VERSION, S.EPOCH: int(pos["epoch"]), S.STEP: int(pos["step"]), S.WORKER: worker,
                 S.NUM_WORKERS: pos["num_workers"], S.WORLD_SIZE: self.world_size, S.SEED: self.config.seed,
                 S.FINGERPRINT: self.fingerprint, S.CONFIG: self.config.describe(),
                 S.SKIPPED: self._shared.skipped(None if worker is None else SharedState.slot(worker))}
        if pos["segments"]:  # the epoch's runs at earlier world sizes (rank-independent, like the rest)
            state[S.SEGMENTS] = [list(seg) for seg in pos["segments"]]
        if self.sources is not None:
            state[S.SOURCES] = [list(p) for p in self.source_positions(pos["epoch"])]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` was saved: the next pass over its epoch
        skips the steps already yielded, planning past them from the sidecar
        lengths without reading their tar data. Everything is checked before
        anything changes. In the main process with ``verify`` under
        torch.distributed this is a collective (all ranks must resume alike).

        ``state`` is any rank's ``state_dict()`` (they are equal) or, in the
        main process, a torchdata ``StatefulDataLoader.state_dict()``. Saved
        at another world size, the rest of the epoch is planned for this one
        (elastic resume, ``replan.py``). With DataLoader workers only the
        loader knows where the world stopped (each worker's state holds its
        own next step): load the loader's state here, in the main process,
        before iterating; restoring it into the loader as well is optional."""
        info = get_worker_info()
        failure, pos, segments = None, None, ()
        try:
            if info is None and is_loader_state(state):
                state = dataset_state_from_loader(state)
            pos = read_position(state, self, info)
            done = sum(k for _, k in pos.segments)
            # from another world size: the saver's run becomes a finished segment of the epoch
            segments = resize(pos.segments, pos.world_size, pos.step, done, self.world_size)
            if info is None and pos.world_size != self.world_size:
                self._summary(pos.epoch, segments)  # plans the rest now: a history that does not fit raises here
            elif info is not None and pos.world_size != self.world_size:
                nxt = pos.step + (info.id if pos.worker is None else 0)
                segments = self._prepared(pos.epoch, pos.segments, pos.world_size, nxt, info.num_workers)
        except Exception as exc:
            failure = exc
        if info is None and self.verify and active(self.world_size):
            agree({"fingerprint": self.fingerprint, "epoch": pos.epoch if pos else 0, "step": pos.step if pos else 0,
                   "elastic history": _segments_key(segments)},
                  "the resumed position" + (f" (epoch {pos.epoch}, step {pos.step})" if pos else ""), failure)
        elif failure is not None:
            raise failure
        if pos.worker is not None:
            self._local_resume = {"epoch": pos.epoch, "step": pos.step, "limit": pos.num_workers,
                                  "segments": segments}
        elif info is not None:  # a main-process state loaded inside a worker
            self._local_resume = {"epoch": pos.epoch, "step": pos.step + info.id, "limit": info.num_workers,
                                  "segments": segments}
        else:
            self._segments.set(pos.epoch, segments)
            self._shared.set_resume(pos.epoch, pos.step)
        # A main-process total restored in workers goes to worker 0 alone, so it is counted once.
        mine = pos.skipped if pos.worker is not None or info is None or info.id == 0 else 0
        self._shared.restore_skipped(SharedState.slot(None if info is None else info.id), mine)
        self._pos = None

    def _prepared(self, epoch: int, segments: Segments, saved_world: int, nxt: int, workers: int) -> Segments:
        """In a worker: the history of an elastic resume that the main process
        loaded, checked against this worker's own saved next step ``nxt``."""
        have = self._segments.get(epoch)
        n = len(segments)
        fits = have[:n] == segments and (len(have) == n or (len(have) == n + 1 and have[n][0] == saved_world))
        if not fits or not nxt - workers < sum(k for _, k in have) <= nxt:
            raise ValueError(
                f"this DataLoader worker got a state saved at world_size={saved_world} (this run: "
                f"{self.world_size}); only the loader knows where that world stopped, so load the loader's whole "
                "state into the dataset in the main process first: ds.load_state_dict(loader_state), then "
                "iterate the loader (restoring loader_state into it too is optional)"
            )
        return have

    # ------------------------------------------------------------ iteration

    def __iter__(self):
        info = get_worker_info()
        stride = info.num_workers if info is not None else 1
        worker = info.id if info is not None else None
        epoch = self.epoch
        limit = 0
        if self._local_resume is not None:
            epoch, start, limit, segments = (self._local_resume[k] for k in ("epoch", "step", "limit", "segments"))
            self._local_resume = None
        else:
            segments = self._segments.get(epoch)
            resume = self._shared.claim(epoch, worker, stride)
            # an elastically resumed epoch: this world's steps start after the earlier worlds'
            start = (resume if resume is not None else sum(k for _, k in segments)) + (worker or 0)
            limit = 0 if worker is None else stride
        self._slot = SharedState.slot(worker)
        self._pos = {"epoch": epoch, "step": start, "worker": worker, "num_workers": 0 if info is None else stride,
                     "segments": segments}
        return self._generate(epoch, start, stride, limit, segments)

    def _generate(self, epoch: int, start: int, stride: int, limit: int, segments: Segments = ()):
        reader = LocalReader()
        # Remote shards: byte ranges downloaded whole into a node-local cache, read by offset (remote_io.py).
        info = get_worker_info()
        remote = self.remote.reader(self.catalog, self.rank, info.id if info is not None else 0, stride, start)
        total = 0
        tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        try:
            for win, nxt in lookahead(self._windows(epoch, segments), remote is not None):
                lo, hi = win.first_step, win.first_step + win.num_steps
                total = hi
                first = start if lo <= start else start + -(-(lo - start) // stride) * stride
                steps = range(first, hi, stride)
                if remote is not None:
                    remote.enter(epoch, win, nxt)
                if not steps:
                    continue  # planned from lengths only: no tar data read
                batches = [win.plan.batch(s - lo, self.rank) for s in steps]
                mine = np.unique(np.concatenate(batches))
                shards = np.unique(win.shard_ids[mine])
                needed = set(shards.tolist())
                for s in [s for s in tables if s not in needed]:
                    del tables[s]
                for s in shards.tolist():
                    if s not in tables:
                        try:
                            if remote is not None and not is_local(self.catalog.urls[s]):
                                tables[s] = remote.shard_table(s)
                            else:
                                tables[s] = self.catalog.table(s)
                        except ShardError as exc:
                            if self.on_error == "raise":
                                raise
                            tables[s] = exc  # each of the shard's samples is skipped and counted below
                reader.keep_only(self.catalog.urls[s] for s in shards.tolist())
                for s, idx in zip(steps, batches):
                    batch = [x for x in (self._sample(win, i, tables, reader, remote) for i in idx.tolist())
                             if x is not None]
                    self._pos["step"] = s + stride
                    self.bytes_read = reader.bytes_read + (remote.bytes_read if remote is not None else 0)
                    yield self.collate_fn(batch) if self.collate_fn is not None else batch
            if remote is not None:
                remote.leave()
            if start > total + limit:
                raise ValueError(f"resuming at step {start} of epoch {epoch}, which has only {total} steps: the "
                                 "state or start batch does not belong to this dataset")
        finally:
            self.bytes_read = reader.bytes_read + (remote.bytes_read if remote is not None else 0)
            reader.close()
            if remote is not None:
                remote.close()

    def _sample(self, win, i: int, tables, reader: LocalReader, remote):
        shard = int(win.shard_ids[i])
        local = int(win.local[i])
        url = self.catalog.urls[shard]
        try:
            if isinstance(tables[shard], Exception):
                raise tables[shard]
            keys, offsets, sizes = tables[shard]
            offset, size = int(offsets[local]), int(sizes[local])
            key = keys[local].decode("utf-8", "surrogateescape")
            if is_local(url):
                buf = reader.read(url, offset, size)
            else:
                buf = remote.read(shard, offset, size)
            sample = parse_sample(buf, url, offset, key)
            if self.decode is not None:
                try:
                    sample = self.decode(sample)
                except Exception as exc:
                    raise ShardError(f"decoding sample {key!r} of shard {url} (byte {offset}) failed: {exc!r}") from exc
                if sample is None:
                    raise ShardError(f"decode returned None for sample {key!r} of shard {url} (byte {offset}); "
                                     "return the sample, or raise to have it skipped with on_error='skip'")
            return sample
        except ShardError as exc:
            if self.on_error == "raise":
                raise
            self._shared.add_skip(self._slot)
            log.warning("skipping a sample (on_error='skip', %d skipped by this process so far): %s",
                        self._shared.skipped(self._slot), exc)
            return None

    def __repr__(self) -> str:
        c = self.config
        return (f"StreamingBatches({len(self.catalog.urls)} shards, {self.catalog.num_samples} samples, "
                f"max_batch_tokens={c.max_batch_tokens}, max_batch_size={c.max_batch_size}, "
                f"rank={self.rank}, world_size={self.world_size}, window_samples={c.window_samples}, "
                f"read_mode={c.read_mode!r}, "
                f"epoch={self.epoch})")


def _as_list(sources: Any) -> list:
    return list(sources) if isinstance(sources, (list, tuple)) else [sources]


def _segments_key(segments: Segments) -> int:
    """A 63-bit hash of an elastic history (0 for none), for the cross-rank check."""
    if not segments:
        return 0
    return config_fingerprint(np.array([x for seg in segments for x in seg], dtype=np.int64))


# ---------------------------------------------------------------- distributed


def _index_share(urls, rank, world_size, index_dir, length_from, frames_per_second, workers) -> None:
    """With index_missing under torch.distributed, each rank indexes 1/W of
    the missing local shards, then all meet at one barrier."""
    from .indexer import index_shards

    mine = [u for i, u in enumerate(expand_urls(urls)) if i % world_size == rank and is_local(u)]
    try:
        if mine:
            index_shards(mine, length_from=length_from or "json:duration", frames_per_second=frames_per_second,
                         index_dir=index_dir, workers=workers, progress=False)
    finally:
        torch.distributed.barrier()
