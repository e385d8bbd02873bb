"""``StreamingBatches``: the torch glue over sidecars, window plans and tar reads."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..core import state as S
from ..core.config import check_epoch
from ..core.long_samples import check_max_length, too_long
from ..core.validation import check_flag, check_int
from ..planners import RECOMMENDED, plan_epoch
from ..torch_glue.distributed import active, agree, guess_world, is_distributed, resolve_world, will_check
from .affinity import warm_up as warm_up_affine
from .audio import decode_audio
from .catalog import Catalog, open_catalog
from .catalog_file import catalog_urls, is_catalog
from .errors import ShardError
from .position import SharedState, read_position
from .reader import LocalReader, expand_urls, is_local
from .remote import RetryPolicy
from .remote_io import RemoteIO, check_identity, lookahead
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
                 max_length: Any = None, long_samples: str = "drop", storage_options: dict | None = None,
                 cache_dir: str | None = None, prefetch_shards: Any = 4, prefetch_bytes: Any = None,
                 retry: Any = None, **planner_options: Any):
        super().__init__()
        failure: BaseException | None = None
        world: Any = world_size
        try:
            index_missing = check_flag("index_missing", index_missing)
            if isinstance(verify, str) and verify != "full":
                raise TypeError(f"verify must be True, False or 'full', got {verify!r}")
            verify_shards = "full" if verify == "full" else "stat"
            self.verify = True if verify_shards == "full" else check_flag("verify", verify)
            rank, world = resolve_world(rank, world_size)
            max_length, long_samples = check_max_length(max_length, long_samples)
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
                    _index_share(urls, rank, world, index_dir, length_from, frames_per_second, index_workers)
                except Exception as exc:
                    failure = exc
            agree({"fingerprint": 0}, "indexing the missing shards", failure)
        if failure is None:
            try:
                self.catalog: Catalog = open_catalog(
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
                self.fingerprint = self.config.fingerprint(self.catalog.fingerprint())
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
        self._summaries: dict[int, EpochSummary] = {}
        self._pos: dict[str, Any] | None = None
        self._local_resume: dict[str, Any] | None = None
        self._slot = 0  # this process's skip counter: the main process's, or a worker's (set per pass)
        self.bytes_read = 0  # tar bytes this process read (files and streams)

    # ------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        return self._shared.epoch

    def set_epoch(self, epoch: Any) -> None:
        """Select the epoch the next pass plans (shard order and windows)."""
        self._shared.epoch = check_epoch(epoch)

    def set_start_batch(self, start: Any) -> None:
        """Make the next pass over the current epoch start at this rank's
        ``start``-th batch (for resuming from a step count you saved). Only
        the next pass: later passes over the epoch start from its beginning."""
        start = check_int("start", start, 0, len(self))
        self._shared.set_resume(self.epoch, start)
        self._pos = None

    def epoch_summary(self, epoch: Any = None) -> EpochSummary:
        """Steps, samples, padding and drops of an epoch, planned from the
        sidecars' lengths only (no tar is read). Cached per epoch."""
        epoch = self.epoch if epoch is None else check_epoch(epoch)
        if epoch not in self._summaries:
            self._summaries[epoch] = summary = summarize(self.catalog.counts, self.catalog.lengths, self.config,
                                                         epoch)
            if summary.too_long and not self._summaries.keys() - {epoch}:  # once per dataset, not per epoch
                log.warning("StreamingBatches: %d of %d samples are longer than max_length=%d and are left out",
                            summary.too_long, self.catalog.num_samples, self.config.max_length)
        return self._summaries[epoch]

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
            pos = {"epoch": self.epoch, "step": pending or 0, "worker": None, "num_workers": 0}
        worker = pos["worker"]
        return {S.VERSION: S.STATE_VERSION, S.EPOCH: int(pos["epoch"]), S.STEP: int(pos["step"]), S.WORKER: worker,
                S.NUM_WORKERS: pos["num_workers"], S.WORLD_SIZE: self.world_size, S.SEED: self.config.seed,
                S.FINGERPRINT: self.fingerprint, S.CONFIG: self.config.describe(),
                S.SKIPPED: self._shared.skipped(None if worker is None else SharedState.slot(worker))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` was saved: the next pass over its epoch
        skips the steps already yielded, planning past them from the sidecar
        lengths without reading their tar data. Everything is checked before
        anything changes. In the main process with ``verify`` under
        torch.distributed this is a collective (all ranks must resume alike)."""
        info = get_worker_info()
        failure, pos = None, None
        try:
            pos = read_position(state, self, info)
        except Exception as exc:
            failure = exc
        if info is None and self.verify and active(self.world_size):
            agree({"fingerprint": self.fingerprint, "epoch": pos.epoch if pos else 0, "step": pos.step if pos else 0},
                  "the resumed position" + (f" (epoch {pos.epoch}, step {pos.step})" if pos else ""), failure)
        elif failure is not None:
            raise failure
        if pos.worker is not None:
            self._local_resume = {"epoch": pos.epoch, "step": pos.step, "limit": pos.num_workers}
        elif info is not None:  # a main-process state loaded inside a worker
            self._local_resume = {"epoch": pos.epoch, "step": pos.step + info.id, "limit": info.num_workers}
        else:
            self._shared.set_resume(pos.epoch, pos.step)
        # A main-process total restored in workers goes to worker 0 alone, so it is counted once.
        mine = pos.skipped if pos.worker is not None or info is None or info.id == 0 else 0
        self._shared.restore_skipped(SharedState.slot(None if info is None else info.id), mine)
        self._pos = None

    # ------------------------------------------------------------ iteration

    def __iter__(self):
        info = get_worker_info()
        stride = info.num_workers if info is not None else 1
        worker = info.id if info is not None else None
        epoch = self.epoch
        limit = 0
        if self._local_resume is not None:
            epoch, start, limit = self._local_resume["epoch"], self._local_resume["step"], self._local_resume["limit"]
            self._local_resume = None
        else:
            resume = self._shared.claim(epoch, worker, stride)
            start = (resume or 0) + (worker or 0)
            limit = 0 if worker is None else stride
        self._slot = SharedState.slot(worker)
        self._pos = {"epoch": epoch, "step": start, "worker": worker, "num_workers": 0 if info is None else stride}
        return self._generate(epoch, start, stride, limit)

    def _generate(self, epoch: int, start: int, stride: int, limit: int):
        reader = LocalReader()
        # Remote shards: byte ranges downloaded whole into a node-local cache, read by offset (remote_io.py).
        info = get_worker_info()
        remote = self.remote.reader(self.catalog, self.rank, info.id if info is not None else 0, stride, start)
        total = 0
        tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        try:
            windows = iter_windows(self.catalog.counts, self.catalog.lengths, self.config, epoch)
            for win, nxt in lookahead(windows, remote is not None):
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
