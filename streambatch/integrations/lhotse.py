"""A lhotse sampler with streambatch's balanced global steps.

``BalancedCutSampler(cuts, max_duration=..., ...)`` takes the arguments of
lhotse's ``DynamicBucketingSampler`` and yields ``CutSet`` mini-batches, so it
drops into a lhotse training loop (``K2SpeechRecognitionDataset`` or any
dataset that takes a ``CutSet``, ``DataLoader(dataset, sampler=sampler,
batch_size=None)``) unchanged. What changes: every step is planned for all
ranks at once (each rank's batch costs about the same, every rank yields the
same number of batches), and its state resumes exactly, or elastically at
another world size (``DynamicBatchSampler``'s, which it is).

Mapping of lhotse's arguments:

- ``max_duration`` (seconds) -> the token budget ``max_duration x frames_per_second``
  for batch size x longest cut (the padded duration, which bounds lhotse's sum
  of durations too); ``max_cuts`` -> the batch-size cap (default 1,024);
- ``shuffle``, ``drop_last``, ``seed``, ``world_size``, ``rank``: as in lhotse
  (rank and world size from the arguments, else ``WORLD_SIZE``/``RANK``, else
  ``torch.distributed``, else 0 and 1); ``seed`` must be an integer ("randomized"
  and "trng" would make ranks plan differently);
- the bucketing knobs (``num_buckets``, ``duration_bins``, ``buffer_size``,
  ``quadratic_duration``, ...) are accepted and ignored: the planner buckets the
  whole corpus by length itself (``planner="bucketed"``).

Cuts: an eager ``CutSet`` is used as it is; a lazy one is read once into memory
(its cuts' metadata: audio stays where the cuts point). A lazy Shar ``CutSet``
(``CutSet.from_shar``) is planned from its cuts files alone, and each batch's
recordings are read by member offset from the ``recording`` tars (local files,
or ranged reads of remote ones), the rank's own cuts only. The metadata of every
cut is held in memory (not the audio); for corpora too large for that, stream
the Shar directory with ``StreamingBatches``.

Stream: ``CutSet`` mini-batches, this rank's share of each global step."""

from __future__ import annotations

import difflib
import inspect
import json
import math
import numbers
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
from lhotse import CutSet
from lhotse.serialization import deserialize_item
from lhotse.shar.readers.lazy import LazySharIterator
from lhotse.shar.utils import fill_shar_placeholder

from ..core.redact import logger
from ..core.units import seconds_to_frames
from ..streaming.errors import ShardError
from ..streaming.io.objects import is_remote
from ..streaming.io.reader import LocalReader
from ..streaming.io.remote import RemoteShard
from ..streaming.shards.corpora.base import OpenSettings, json_bytes, scan_members, tar_members
from ..streaming.shards.corpora.shar import Shar, read_cuts
from ..torch_glue.prefetch import prefetching_loader
from ..torch_glue.sampler import DynamicBatchSampler

log = logger("streambatch.lhotse")  # scrubs URLs (credentials) from what it logs

# DynamicBucketingSampler's bucketing knobs: the planner buckets by length itself
_IGNORED = ("num_buckets", "duration_bins", "num_cuts_for_bins_estimate", "buffer_size", "quadratic_duration",
            "sync_buckets", "concurrent", "shuffle_buffer_size", "consistent_ids", "strict")
DEFAULT_MAX_CUTS = 1024
# DynamicBatchSampler's (and other loaders') names for what this sampler calls max_duration and max_cuts: a
# keyword this class does not take goes on to the planner's option check, whose hint would name
# DynamicBatchSampler's keyword, which this class does not take either
_OWN_NAMES = {"max_batch_tokens": "max_duration", "max_tokens": "max_duration", "batch_tokens": "max_duration",
              "max_frames": "max_duration", "max_batch_size": "max_cuts", "batch_size": "max_cuts",
              "max_batch": "max_cuts"}


def world_of(world_size: int | None, rank: int | None) -> tuple[int, int]:
    """(world_size, rank) as lhotse's samplers resolve them: the arguments, else the launcher's environment
    variables, else torch.distributed, else (1, 0)."""
    import torch.distributed as dist

    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        env = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    elif dist.is_available() and dist.is_initialized():
        env = dist.get_world_size(), dist.get_rank()
    else:
        env = 1, 0
    return (env[0] if world_size is None else world_size), (env[1] if rank is None else rank)


class _SharCuts:
    """The cuts of a Shar ``CutSet`` without their audio, and each batch's recordings read by member offset."""

    def __init__(self, it: LazySharIterator, audio_field: str = "recording"):
        streams = {k: [str(p) for p in v] for k, v in it.streams.items()}
        self.field = audio_field if audio_field in streams else None
        spec = Shar(fields={"cuts": streams["cuts"], audio_field: streams.get(audio_field, streams["cuts"])},
                    audio_field=audio_field) if self.field else None
        self.cut_files = streams["cuts"]
        self.tars = spec.files(OpenSettings())[1] if spec is not None else []
        # metadata only, no tar opened; kept as JSON (lhotse's from_dict consumes the dict it is given)
        self.lines = [[json_bytes(c) for c in read_cuts(f)] for f in self.cut_files]
        self.starts = np.concatenate([[0], np.cumsum([len(x) for x in self.lines])]).astype(np.int64)
        self._tables: dict[int, tuple] = {}
        self._local = LocalReader()

    def durations(self) -> np.ndarray:
        return np.array([json.loads(c)["duration"] for x in self.lines for c in x], dtype=np.float64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _table(self, shard: int):
        if shard not in self._tables:
            members = scan_members(self.tars[shard])
            pairs = list(zip(members[::2], members[1::2]))
            if len(pairs) != len(self.lines[shard]):
                raise ShardError(f"Shar tar {self.tars[shard]} holds {len(pairs)} cuts, its cuts file "
                                 f"{self.cut_files[shard]} {len(self.lines[shard])}")
            self._tables[shard] = tuple((d.offset, m.end - d.offset) for d, m in pairs)
        return self._tables[shard]

    def _bytes(self, shard: int, offset: int, size: int) -> bytes:
        url = self.tars[shard]
        if is_remote(url):
            return RemoteShard(url).read_range(offset, offset + size)
        return self._local.read(url, offset, size)

    def get(self, indices: list[int]) -> list[Any]:
        out = []
        for i in indices:
            shard = int(np.searchsorted(self.starts, i, side="right") - 1)
            cut = deserialize_item(json.loads(self.lines[shard][i - int(self.starts[shard])]))
            if self.field is not None:
                offset, size = self._table(shard)[i - int(self.starts[shard])]
                members = tar_members(self._bytes(shard, offset, size), self.tars[shard], offset, cut.id)
                name, data = members[0]
                if name.rsplit(".", 1)[0] != cut.id:
                    raise ShardError(f"Shar tar {self.tars[shard]} holds {name!r} where cut {cut.id!r} belongs")
                if not name.endswith(".nodata"):
                    fill_shar_placeholder(getattr(cut, self.field), data=data, tarpath=name)
            out.append(cut)
        return out


class _EagerCuts:
    def __init__(self, cuts: Any):
        self.cuts = list(cuts)

    def durations(self) -> np.ndarray:
        return np.array([c.duration for c in self.cuts], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.cuts)

    def get(self, indices: list[int]) -> list[Any]:
        return [self.cuts[i] for i in indices]


def _check_own_names(options: dict[str, Any]) -> None:
    """A TypeError naming this sampler's keyword for one of ``options`` that means it (``batch_size`` ->
    ``max_cuts``, ``max_duraton`` -> ``max_duration``); options that are none of these are the planner's."""
    own = [p for p in inspect.signature(BalancedCutSampler.__init__).parameters if p not in ("self", "options")]
    for name in options:
        close = difflib.get_close_matches(name, own, n=1, cutoff=0.8)
        meant = _OWN_NAMES.get(name) or (close[0] if close else None)
        if meant is not None:
            why = (" (it takes lhotse's names: max_duration in seconds per batch, max_cuts per batch)"
                   if meant in ("max_duration", "max_cuts") else "")
            raise TypeError(f"BalancedCutSampler got an unexpected keyword {name!r}: did you mean {meant}=?{why}")


class BalancedCutSampler(DynamicBatchSampler):
    """``CutSet`` mini-batches with balanced global steps: a drop-in for lhotse's ``DynamicBucketingSampler``.

    cuts: a ``CutSet`` (eager, lazy, or a lazy Shar ``CutSet``: see the module docstring).
    max_duration / max_cuts / shuffle / drop_last / world_size / rank / seed: as for lhotse's samplers.
    frames_per_second: the resolution durations are planned at (default 100: 10 ms).
    planner, verify, max_length (seconds), **planner_options: as for ``DynamicBatchSampler``
    (default planner ``"bucketed"``). ``len()``, ``set_epoch``, ``state_dict`` / ``load_state_dict``
    (exact, or elastic at another world size) are ``DynamicBatchSampler``'s.
    """

    def __init__(self, cuts: Any, max_duration: float | None = None, max_cuts: int | None = None,
                 shuffle: bool = False, drop_last: bool = False, world_size: int | None = None,
                 rank: int | None = None, seed: Any = 0, *, frames_per_second: float = 100.0,
                 planner: str = "bucketed", verify: bool = True, max_length: float | None = None,
                 **options: Any) -> None:
        ignored = sorted(k for k in options if k in _IGNORED)
        if "constraint" in options:
            raise ValueError("BalancedCutSampler plans under a token budget (max_duration, max_cuts); lhotse's "
                             "SamplingConstraint objects are not supported")
        planner_options = {k: v for k, v in options.items() if k not in _IGNORED}
        _check_own_names(planner_options)
        if ignored:
            log.info("BalancedCutSampler: %s do not apply (the planner buckets by length itself)", ", ".join(ignored))
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"seed must be an integer (every rank plans the same steps from it), got {seed!r}")
        if not isinstance(cuts, CutSet):
            raise TypeError(f"cuts must be a lhotse CutSet, got {type(cuts).__name__}")
        if max_duration is None and max_cuts is None:
            raise ValueError("give max_duration (seconds per batch) and/or max_cuts, as for lhotse's samplers")
        for name, v in (("max_duration", max_duration), ("max_length", max_length)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0
                                  or not math.isfinite(v)):
                raise ValueError(f"{name} must be a number of seconds > 0, got {v!r}")
        self.frames_per_second = float(frames_per_second)
        data = getattr(cuts, "data", None)
        self.cuts = _SharCuts(data) if isinstance(data, LazySharIterator) else _EagerCuts(cuts)
        durations = self.cuts.durations()
        lengths = seconds_to_frames(durations, self.frames_per_second) if durations.size else durations.astype(int)
        longest = int(lengths.max()) if lengths.size else 1
        budget = (int(max_duration * self.frames_per_second) if max_duration is not None
                  else longest * (max_cuts or DEFAULT_MAX_CUTS))
        world, r = world_of(world_size, rank)
        super().__init__(lengths, budget, max_cuts or DEFAULT_MAX_CUTS, shuffle=shuffle, drop_last=drop_last,
                         rank=r, world_size=world, seed=int(seed), planner=planner, verify=verify,
                         max_length=None if max_length is None else seconds_to_frames(max_length,
                                                                                      self.frames_per_second),
                         **planner_options)
        self.max_duration, self.max_cuts = max_duration, max_cuts

    def __iter__(self) -> Iterator[CutSet]:
        return self._cutsets(super().__iter__())

    def _cutsets(self, batches: Iterator[list[int]]) -> Iterator[CutSet]:
        for n, idx in enumerate(batches):
            if n == 0:  # (the caller of this generator is the one a DataLoader prefetch check must see)
                self._prefetcher = prefetching_loader(sys._getframe(1))
            yield CutSet.from_cuts(self.cuts.get(idx))
