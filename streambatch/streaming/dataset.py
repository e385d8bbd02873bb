"""``StreamingBatches``: the torch glue over sidecars, window plans and tar reads."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing.context
from collections.abc import Callable
from multiprocessing.sharedctypes import RawArray
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..planners import check_planner, make_plan
from ..torch_glue.distributed import check_same_everywhere, is_distributed, resolve_world
from ..core.validation import check_budget, check_flag, check_int, check_seed
from .audio import decode_audio
from .catalog import Catalog, open_catalog
from .errors import ShardError
from .reader import LocalReader, expand_urls, is_local
from .catalog_file import catalog_urls, is_catalog
from .remote import RetryPolicy
from .remote_io import RemoteIO, check_identity, lookahead
from .tar import parse_sample
from .affinity import warm_up as warm_up_affine
from .window import EpochSummary, WindowConfig, check_read_mode, default_window, iter_windows, summarize

log = logging.getLogger("streambatch.streaming")

STATE_VERSION = 1
# Shared block: [epoch, resume epoch (-1: none), resume step]. Lives in shared
# memory so that set_epoch / load_state_dict in the main process reach
# persistent DataLoader workers, which hold copies of the dataset.
_EPOCH, _RESUME_EPOCH, _RESUME_STEP = 0, 1, 2


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
        ``make_plan``; each window is planned with them.
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
    rank, world_size: default to ``torch.distributed`` when initialised, else 0/1.
    length_from, frames_per_second: how lengths are computed when indexing on
        the fly; if given, sidecars made another way count as stale.
    decode: None (raw bytes), ``"audio"`` (audio -> (float32 tensor (C, T),
        sample_rate), json -> object, txt -> str) or a function of a sample.
    on_error: ``"raise"`` (default) or ``"skip"``: a sample that cannot be
        read or decoded is logged, counted in ``num_skipped`` and left out of
        its batch; the batch is still yielded (possibly empty), so every rank
        takes the same steps.
    verify: when ``torch.distributed`` is initialised, all-reduce a
        fingerprint of shards, sidecars and config once at construction and
        raise on every rank if any rank differs (no collectives afterwards,
        none in DataLoader workers). Remote shards are also checked against
        the size and ETag recorded at indexing (each rank checks 1/W of them).
    storage_options, cache_dir, prefetch_shards, prefetch_bytes, retry:
        remote shards (``s3://``, ``gs://``, ``https://``, ``hf://``, ``pipe:``;
        see ``remote_io.RemoteIO``): fsspec options, the node-local cache
        directory, how far ahead to download, and the ``RetryPolicy``.
    """

    def __init__(self, urls: Any, max_batch_tokens: Any, max_batch_size: Any = 64, *,
                 window_samples: Any = None, read_mode: str | None = None, shuffle: bool = True,
                 drop_last: bool = False, seed: Any = 42,
                 rank: Any = None, world_size: Any = None, planner: str = "greedy",
                 index_dir: str | None = None, index_missing: bool = False, length_from: Any = None,
                 frames_per_second: Any = None, index_workers: Any = 1, decode: Any = None,
                 collate_fn: Callable | None = None, on_error: str = "raise", verify: bool = True,
                 storage_options: dict | None = None, cache_dir: str | None = None, prefetch_shards: Any = 4,
                 prefetch_bytes: Any = None, retry: Any = None, **planner_options: Any):
        super().__init__()
        tokens = check_budget(max_batch_tokens)
        size = check_int("max_batch_size", max_batch_size, 1)
        seed = check_seed(seed)
        shuffle, drop_last = check_flag("shuffle", shuffle), check_flag("drop_last", drop_last)
        index_missing, verify = check_flag("index_missing", index_missing), check_flag("verify", verify)
        check_planner(planner)
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if decode is not None and decode != "audio" and not callable(decode):
            raise ValueError(f"decode must be None, 'audio' or a function of a sample dict, got {decode!r}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}")
        rank, world_size = resolve_world(rank, world_size)
        if read_mode is None:
            shard_urls = catalog_urls(urls, storage_options) if is_catalog(urls) else expand_urls(urls)
            read_mode = "sample" if all(is_local(u) for u in shard_urls) else "shard"
        read_mode = check_read_mode(read_mode)
        if window_samples is None:
            window_samples = default_window(read_mode, world_size)
        window = check_int("window_samples", window_samples, 1)
        url_hint = urls if isinstance(urls, str) else None
        if index_missing and is_distributed() and world_size > 1:
            _index_share(urls, rank, world_size, index_dir, length_from, frames_per_second, index_workers)
        self.config = WindowConfig(tokens, size, world_size, window, shuffle, drop_last, seed,
                                   planner, tuple(sorted(planner_options.items())), read_mode)
        failure = None
        try:
            self.catalog: Catalog = open_catalog(urls, index_dir=index_dir, index_missing=index_missing,
                                                 length_from=length_from, frames_per_second=frames_per_second,
                                                 index_workers=index_workers, url_hint=url_hint,
                                                 storage_options=storage_options)
            if verify:  # remote shards changed since indexing: fail now, not mid-epoch
                check_identity(self.catalog, rank, world_size, storage_options,
                               retry if isinstance(retry, RetryPolicy) else None)
            h = hashlib.blake2b(digest_size=8)
            h.update((self.catalog.fingerprint() + repr(self.config.key())).encode())
            self.fingerprint = h.hexdigest()
        except (OSError, ValueError, TypeError, ImportError) as exc:
            failure = exc
        if verify:
            # A rank that failed to open its sidecars still joins the check
            # (with fingerprint 0), so the others raise too instead of hanging.
            try:
                check_same_everywhere(0 if failure else int(self.fingerprint, 16) >> 1,
                                      "the streaming plan (shard list, sidecars or streaming settings)")
            except ValueError:
                if failure is None:
                    raise
        if failure is not None:
            raise failure
        if self.catalog.num_samples == 0:
            raise ValueError(f"the {len(self.catalog.urls)} shards hold no samples; check the shard list")
        self.rank = rank
        self.world_size = world_size
        self.decode = decode_audio if decode == "audio" else decode
        self.collate_fn = collate_fn
        self.on_error = on_error
        # Load the compiled planner now, so DataLoader workers forked later
        # inherit it instead of each loading (or compiling) it again.
        if read_mode == "shard":
            warm_up_affine(tokens, size, world_size, planner_options)
        else:
            make_plan(np.ones(world_size, dtype=np.int64), tokens, size, world_size, planner=planner,
                      **planner_options)
        self._shared = RawArray("q", [0, -1, 0])
        self._summaries: dict[int, EpochSummary] = {}
        self._pos: dict[str, Any] | None = None
        self._local_resume: dict[str, Any] | None = None
        self.num_skipped = 0
        self.bytes_read = 0  # tar bytes this process read (files and streams)
        self._stream_bytes = 0
        self.remote = RemoteIO.for_catalog(self.catalog, rank, storage_options=storage_options, cache_dir=cache_dir,
                                           prefetch_shards=prefetch_shards, prefetch_bytes=prefetch_bytes,
                                           retry=retry)

    # ------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        return int(self._shared[_EPOCH])

    def set_epoch(self, epoch: Any) -> None:
        """Select the epoch the next pass plans (shard order and windows)."""
        epoch = check_int("epoch", epoch, 0)
        self._shared[_EPOCH] = epoch
        if self._shared[_RESUME_EPOCH] != epoch:
            self._shared[_RESUME_EPOCH] = -1

    def set_start_batch(self, start: Any) -> None:
        """Make the next pass over the current epoch start at this rank's
        ``start``-th batch (for resuming from a step count you saved)."""
        n = len(self)
        start = check_int("start", start, 0, n)
        self._shared[_RESUME_EPOCH] = self.epoch
        self._shared[_RESUME_STEP] = start

    def epoch_summary(self, epoch: Any = None) -> EpochSummary:
        """Steps, samples, padding and drops of an epoch, planned from the
        sidecars' lengths only (no tar is read). Cached per epoch."""
        epoch = self.epoch if epoch is None else check_int("epoch", epoch, 0)
        if epoch not in self._summaries:
            self._summaries[epoch] = summarize(self.catalog.counts, self.catalog.lengths, self.config, epoch)
        return self._summaries[epoch]

    def __len__(self) -> int:
        """Batches this rank (every rank) yields in the current epoch."""
        return self.epoch_summary().steps

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Position of this process's latest pass: epoch and next step.

        In the main process (``num_workers=0``) ``step`` counts the batches
        yielded. In a DataLoader worker (as torchdata's StatefulDataLoader
        saves it) it is the next step this worker yields.
        """
        pos = self._pos
        if pos is None or pos["epoch"] != self.epoch:
            pending = self._shared[_RESUME_EPOCH] == self.epoch
            pos = {"epoch": self.epoch, "step": int(self._shared[_RESUME_STEP]) if pending else 0,
                   "worker": None, "num_workers": 0}
        return {"version": STATE_VERSION, "epoch": int(pos["epoch"]), "step": int(pos["step"]),
                "worker": pos["worker"], "num_workers": pos["num_workers"], "world_size": self.world_size,
                "fingerprint": self.fingerprint, "skipped": self.num_skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` was saved: the next pass over its epoch
        skips the steps already yielded, planning past them from the sidecar
        lengths without reading their tar data."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a StreamingBatches state (version {STATE_VERSION}): {state!r:.200}")
        if state["world_size"] != self.world_size:
            raise ValueError(
                f"state was saved with world_size={state['world_size']}, this run has world_size="
                f"{self.world_size}; resume with the same number of ranks (the plan depends on it)"
            )
        if state["fingerprint"] != self.fingerprint:
            raise ValueError(
                "state was saved for other shards, sidecars or settings (fingerprint "
                f"{state['fingerprint']} != {self.fingerprint}); resume with the same shard list, sidecars, "
                "max_batch_tokens, max_batch_size, window_samples, read_mode, shuffle, drop_last, seed and planner"
            )
        epoch = check_int("state['epoch']", state["epoch"], 0)
        step = check_int("state['step']", state["step"], 0)
        info = get_worker_info()
        if state["worker"] is not None:
            if info is None or (info.id, info.num_workers) != (state["worker"], state["num_workers"]):
                here = "the main process" if info is None else f"worker {info.id} of {info.num_workers}"
                raise ValueError(
                    f"state was saved by DataLoader worker {state['worker']} of {state['num_workers']} and is "
                    f"being loaded in {here}; restore it through a StatefulDataLoader with "
                    f"num_workers={state['num_workers']}, or save the main process's state instead"
                )
            self._local_resume = {"epoch": epoch, "step": step}
        elif info is not None:  # a main-process state loaded inside a worker
            self._local_resume = {"epoch": epoch, "step": step + info.id}
        else:
            self._shared[_EPOCH] = epoch
            self._shared[_RESUME_EPOCH] = epoch
            self._shared[_RESUME_STEP] = step
        self._pos = None

    # ------------------------------------------------------------ iteration

    def __iter__(self):
        info = get_worker_info()
        stride = info.num_workers if info is not None else 1
        worker = info.id if info is not None else 0
        epoch = self.epoch
        if self._local_resume is not None:
            epoch, start = self._local_resume["epoch"], self._local_resume["step"]
            self._local_resume = None
        elif self._shared[_RESUME_EPOCH] == epoch:
            start = int(self._shared[_RESUME_STEP]) + worker
            if info is None:  # the main process consumes a resume; workers cannot tell when all have
                self._shared[_RESUME_EPOCH] = -1
        else:
            start = worker
        self._pos = {"epoch": epoch, "step": start, "worker": None if info is None else worker,
                     "num_workers": 0 if info is None else stride}
        return self._generate(epoch, start, stride)

    def _generate(self, epoch: int, start: int, stride: int):
        reader = LocalReader()
        # Remote shards: whole-shard downloads into a node-local cache, read by offset (remote_io.py).
        info = get_worker_info()
        remote = self.remote.reader(self.catalog, self.rank, info.id if info is not None else 0, stride, start)
        tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        try:
            windows = iter_windows(self.catalog.counts, self.catalog.lengths, self.config, epoch)
            for win, nxt in lookahead(windows, remote is not None):
                lo, hi = win.first_step, win.first_step + win.num_steps
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
                        remote_shard = remote is not None and not is_local(self.catalog.urls[s])
                        tables[s] = remote.shard_table(s) if remote_shard else self.catalog.table(s)
                reader.keep_only(self.catalog.urls[s] for s in shards.tolist())
                for s, idx in zip(steps, batches):
                    batch = [x for x in (self._sample(win, i, tables, reader, remote) for i in idx.tolist())
                             if x is not None]
                    self._pos["step"] = s + stride
                    self.bytes_read = reader.bytes_read + (remote.bytes_read if remote is not None else 0)
                    yield self.collate_fn(batch) if self.collate_fn is not None else batch
            if remote is not None:
                remote.leave()
        finally:
            self.bytes_read = reader.bytes_read + (remote.bytes_read if remote is not None else 0)
            reader.close()
            if remote is not None:
                remote.close()

    def _sample(self, win, i: int, tables, reader: LocalReader, remote):
        shard = int(win.shard_ids[i])
        local = int(win.local[i])
        keys, offsets, sizes = tables[shard]
        url = self.catalog.urls[shard]
        offset, size = int(offsets[local]), int(sizes[local])
        key = keys[local].decode("utf-8", "surrogateescape")
        try:
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
            return sample
        except ShardError as exc:
            if self.on_error == "raise":
                raise
            self.num_skipped += 1
            log.warning("skipping a sample (on_error='skip', %d skipped so far): %s", self.num_skipped, exc)
            return None

    # ------------------------------------------------------------ pickling

    def __getstate__(self):
        state = self.__dict__.copy()
        if multiprocessing.context.get_spawning_popen() is None:
            # Plain pickling (checkpoints, deepcopy): shared memory cannot travel, values can.
            state["_shared"] = list(self._shared)
        return state

    def __setstate__(self, state):
        if isinstance(state["_shared"], list):
            state["_shared"] = RawArray("q", state["_shared"])
        self.__dict__.update(state)

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
