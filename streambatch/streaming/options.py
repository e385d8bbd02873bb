"""The settings of a ``StreamingBatches`` beyond planning, grouped by the
stage that uses them.

Users pass them as flat keywords (``cache_dir=...``) or as three small
setting objects with the same field names, one per group (``IndexSettings``,
``RemoteSettings``, ``OutputSettings``: ``remote=RemoteSettings(cache_dir=...)``,
as mosaic's ``Stream`` holds a source's settings); ``ungroup`` turns the
objects back into the keywords, refusing a keyword given both ways. Inside,
``Options.build`` checks them (TypeError/ValueError naming the bad one) and
groups them by stage:

- ``index``: ``IndexOptions`` (``shards/lists.py``), the catalog stage:
  index_missing, length_from, frames_per_second, index_workers, and
  ``verify``'s check of each shard against its sidecar (``index_dir`` goes
  with the shard lists, ``ShardLists``: a ``Source`` may name its own);
- ``remote``: ``RemoteOptions`` (``io/remote_io.py``), remote shards and
  catalogs: storage_options, cache_dir, prefetch_shards, prefetch_bytes,
  retry, trust_catalog;
- ``output``: ``OutputOptions`` (``pipeline/samples.py``), what a step
  becomes: decode, collate_fn, on_error;
- ``checks``: ``Checks``, the three things ``verify`` switches, parsed once:
  whether the ranks check, under torch.distributed, that they built the same
  dataset and resume at the same position; how each local shard is checked
  against its sidecar; whether each remote shard is checked against its
  indexed size and ETag.

The planning settings (budget, cap, planner, window, read mode, shuffle,
seed, max_length) are the ``WindowConfig`` (``epoch/windows.py``).

Stream: nothing: checked settings."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, fields
from typing import Any

from ..core.types import IntLike, LengthFrom
from ..core.validation import check_flag
from .io.remote_io import RemoteOptions
from .io.retry import RetryPolicy
from .pipeline.samples import OutputOptions
from .shards.catalog_trust import check_trust
from .shards.lists import IndexOptions


@dataclass(frozen=True)
class IndexSettings:
    """Where sidecars are and how missing local ones are indexed (``StreamingBatches(index=...)``; the same names
    as its flat keywords, whose defaults these are)."""

    index_dir: str | None = None
    index_missing: bool = False
    length_from: LengthFrom | None = None
    frames_per_second: float | None = None
    index_workers: IntLike | None = 1


@dataclass(frozen=True)
class RemoteSettings:
    """Remote shards and catalogs (``StreamingBatches(remote=...)``): fsspec options (never logged), the node-local
    cache root, downloads ahead per worker, the ``RetryPolicy`` (or a number of retries), what a catalog file may
    list."""

    storage_options: dict[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    cache_dir: str | None = None
    prefetch_shards: IntLike = 4
    prefetch_bytes: IntLike | None = None
    retry: RetryPolicy | int | None = None
    trust_catalog: bool | Collection[str] = False


@dataclass(frozen=True)
class OutputSettings:
    """What a step becomes (``StreamingBatches(output=...)``): decoding, collation, and whether a sample that
    cannot be read or decoded raises or is skipped."""

    decode: Any = None
    collate_fn: Any = None
    on_error: Any = "raise"


GROUPS = {"index": IndexSettings, "remote": RemoteSettings, "output": OutputSettings}


def ungroup(groups: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """The flat keywords (``flat``, as passed) with the fields of the setting objects in ``groups`` ({"index":
    IndexSettings | None, ...}) filled in. A field given both ways (the keyword away from its default) raises."""
    out = dict(flat)
    for name, value in groups.items():
        kind = GROUPS[name]
        if value is None:
            continue
        if not isinstance(value, kind):
            raise TypeError(f"{name} must be a streambatch.streaming.{kind.__name__}, got {value!r:.100}")
        defaults = kind()
        for f in fields(kind):
            if flat[f.name] is not getattr(defaults, f.name) and flat[f.name] != getattr(defaults, f.name):
                raise ValueError(f"{f.name} was given both as a keyword and in {name}={kind.__name__}(...); give it "
                                 "once")
            out[f.name] = getattr(value, f.name)
    return out


@dataclass(frozen=True)
class Checks:
    """What ``verify`` switches, by name (``Checks.parse``, once per dataset).

    ranks: under torch.distributed, the ranks agree at construction (and in a
        main-process ``load_state_dict``) that they built the same dataset and
        resume alike.
    shards: each local shard against its sidecar: ``"stat"`` (size and
        mtime) or ``"full"`` (its content re-hashed).
    remote: each remote shard against its indexed size and ETag, at
        construction (a shard changed since indexing fails now, not mid-epoch).
    """

    ranks: bool
    shards: str
    remote: bool

    @classmethod
    def parse(cls, verify: Any) -> Checks:
        """``verify``: True (the default: ranks, stat, remote), False (none but the stat check) or ``"full"``."""
        if isinstance(verify, str) and verify != "full":
            raise TypeError(f"verify must be True, False or 'full', got {verify!r}")
        on = True if verify == "full" else check_flag("verify", verify)
        return cls(ranks=on, shards="full" if verify == "full" else "stat", remote=on)


@dataclass(frozen=True)
class Options:
    """A ``StreamingBatches``' checked settings beyond planning (see the module docstring)."""

    index: IndexOptions
    remote: RemoteOptions
    output: OutputOptions
    checks: Checks

    @classmethod
    def build(cls, *, index_missing: Any = False, length_from: LengthFrom | None = None,
              frames_per_second: float | None = None, index_workers: IntLike | None = 1, verify: Any = True,
              storage_options: dict[str, Any] | None = None, cache_dir: str | None = None,
              prefetch_shards: IntLike = 4, prefetch_bytes: IntLike | None = None,
              retry: RetryPolicy | int | None = None, trust_catalog: bool | Collection[str] = False,
              decode: Any = None, collate_fn: Any = None, on_error: Any = "raise") -> Options:
        """Check every setting, in the order the constructor always has."""
        index_missing = check_flag("index_missing", index_missing)
        checks = Checks.parse(verify)
        index = IndexOptions(index_missing, length_from, frames_per_second, index_workers, checks.shards)
        remote = RemoteOptions.build(storage_options, cache_dir, prefetch_shards, prefetch_bytes, retry,
                                     check_trust(trust_catalog))
        return cls(index, remote, OutputOptions.build(decode, collate_fn, on_error), checks)
