"""How ``StreamingBatches`` reads: each pass walks the epoch's planned
windows and yields this rank's steps, reading only the tar bytes of the
samples in them (by offset: local files directly, remote shards through
the node-local cache of ``remote_io``).

Stream: batches: this rank's (and worker's) steps of each window, read, parsed, decoded, collated."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import get_worker_info

from ...core.redact import logger, scrub_exception
from ...planners.elastic import Segments
from ..errors import ShardError
from ..formats.tar import parse_sample
from ..io.reader import LocalReader, is_local
from ..io.remote_io import RemoteIO, lookahead
from ..runtime.counters import SharedState
from ..runtime.failures import FailureChannel
from ..shards.catalog import Catalog

if TYPE_CHECKING:
    from ...torch_glue.elastic import SharedSegments
    from ..epoch.windows import Window
    from ..io.remote_reader import RemoteWindowReader

log = logger("streambatch.streaming")


class ReadingMixin:
    """``__iter__`` and the per-window reading generator of ``StreamingBatches``."""

    # set by StreamingBatches.__init__
    catalog: Catalog
    remote: RemoteIO
    rank: int
    decode: Callable[[dict], Any] | None
    collate_fn: Callable | None
    on_error: str
    bytes_read: int
    _shared: SharedState
    _segments: SharedSegments
    _pos: dict[str, Any] | None
    _local_resume: dict[str, Any] | None
    _slot: int
    _failures: FailureChannel | None

    if TYPE_CHECKING:
        @property
        def epoch(self) -> int: ...

        def _windows(self, epoch: int, segments: Segments = ()) -> Iterator[Window]: ...

    def __iter__(self) -> Iterator[Any]:
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
        # The pass updates its own position dict: a later set_start_batch or load_state_dict replaces
        # self._pos without breaking a pass still being iterated.
        pos = {"epoch": epoch, "step": start, "worker": worker, "num_workers": 0 if info is None else stride,
               "segments": segments}
        self._pos = pos
        return self._generate(epoch, start, stride, limit, segments, pos)

    def _generate(self, epoch: int, start: int, stride: int, limit: int, segments: Segments = (),
                  pos: dict[str, Any] | None = None) -> Iterator[Any]:
        pos = {} if pos is None else pos
        reader = LocalReader()
        # Remote shards: byte ranges downloaded whole into a node-local cache, read by offset (remote_io.py).
        info = get_worker_info()
        remote = self.remote.reader(self.catalog, self.rank, info.id if info is not None else 0, stride, start)
        total = 0
        tables: dict[int, Any] = {}  # shard -> (keys, offsets, sizes), or the ShardError reading it
        failures = getattr(self, "_failures", None)  # (datasets pickled before it existed)
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
                    pos["step"] = s + stride
                    self.bytes_read = reader.bytes_read + (remote.bytes_read if remote is not None else 0)
                    if failures is not None:
                        failures.check(epoch)  # another rank failed: stop too, rather than train on and hang
                    yield self.collate_fn(batch) if self.collate_fn is not None else batch
            if remote is not None:
                remote.leave()
            if start > total + limit:
                raise ValueError(f"resuming at step {start} of epoch {epoch}, which has only {total} steps: the "
                                 "state or start batch does not belong to this dataset")
            if failures is not None:
                failures.finish(epoch, stride)  # hear of a failure later in another rank's pass
        except Exception as exc:
            scrub_exception(exc)  # before it leaves the pass (and reaches other ranks): no credentials in it
            if failures is not None:
                failures.report(epoch, exc)
            raise
        finally:
            self.bytes_read = reader.bytes_read + (remote.bytes_read if remote is not None else 0)
            reader.close()
            if remote is not None:
                remote.close()

    def _sample(self, win: Window, i: int, tables: dict[int, Any], reader: LocalReader,
                remote: RemoteWindowReader | None) -> Any:
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
