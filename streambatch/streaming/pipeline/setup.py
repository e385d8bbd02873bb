"""Constructor-time setup of ``StreamingBatches``: argument checks, indexing
missing shards across ranks, opening the shard catalog (or a mix of
sources) and checking its samples. ``StreamingBatches.__init__`` runs these
in order and carries any failure to every rank before raising it.

Stream: nothing (constructor-time checks and the opened catalog)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...core.long_samples import too_long
from ...core.redact import scrub_url
from ...core.validation import check_flag
from ...planners import plan_epoch
from ..epoch.affinity.plan import warm_up as warm_up_affine
from ..epoch.windows import WindowConfig, check_read_mode
from ..io.reader import expand_urls, is_local
from ..io.retry import RetryPolicy
from ..shards.catalog import Catalog, open_catalog
from ..shards.catalog_file import catalog_urls, is_catalog
from ..shards.sources import SourceCatalog, open_sources


def check_verify(verify: Any) -> tuple[bool, str]:
    """``verify`` -> (whether to check across ranks, the shard check: ``"full"`` or ``"stat"``)."""
    if isinstance(verify, str) and verify != "full":
        raise TypeError(f"verify must be True, False or 'full', got {verify!r}")
    verify_shards = "full" if verify == "full" else "stat"
    return (True if verify_shards == "full" else check_flag("verify", verify)), verify_shards


def resolve_read_mode(urls: Any, read_mode: str | None, mixed: bool, storage_options: dict | None,
                      trust: bool | frozenset[str] = False, retry: RetryPolicy | None = None) -> str:
    """The read mode: None picks ``"sample"`` when every shard (of every
    source, for a mix) is a local file, else ``"shard"``."""
    if read_mode is None:
        lists = [x.urls for x in _as_list(urls)] if mixed else [urls]
        shard_urls = [u for x in lists for u in (catalog_urls(x, storage_options, trust=trust, retry=retry)
                                                 if is_catalog(x) else
                                                 expand_urls(x))]
        read_mode = "sample" if all(is_local(u) for u in shard_urls) else "shard"
    return check_read_mode(read_mode)


def check_output(on_error: str, decode: Any, collate_fn: Callable | None) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if decode is not None and decode != "audio" and not callable(decode):
        raise ValueError(f"decode must be None, 'audio' or a function of a sample dict, got {decode!r}")
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}")


def warm_up(config: WindowConfig, world_size: int) -> None:
    """Load the compiled planner now, so DataLoader workers forked later
    inherit it instead of each loading (or compiling) it again."""
    c = config
    if c.read_mode == "shard":
        warm_up_affine(c.max_batch_tokens, c.max_batch_size, world_size, c.options)
    else:
        plan_epoch(np.ones(world_size, dtype=np.int64), c, 0)


def index_missing_shares(urls: Any, mixed: bool, rank: int, world_size: int, index_dir: str | None,
                         length_from: Any, frames_per_second: Any, index_workers: Any) -> None:
    """With ``index_missing`` under torch.distributed: each rank indexes its
    share of every source's missing local shards."""
    for u, d in ([(x.urls, x.index_dir or index_dir) for x in _as_list(urls)] if mixed else [(urls, index_dir)]):
        _index_share(u, rank, world_size, d, length_from, frames_per_second, index_workers)


def open_shards(urls: Any, *, mixed: bool, samples_per_epoch: Any, index_dir: str | None, index_missing: bool,
                length_from: Any, frames_per_second: Any, index_workers: Any, verify_shards: str,
                storage_options: dict | None, trust_catalog: bool | frozenset[str] = False,
                retry: RetryPolicy | None = None
                ) -> tuple[SourceCatalog | None, Catalog]:
    """(the mix of sources or None, the catalog of every shard) from the sidecars."""
    if mixed:
        sources = open_sources(urls, samples_per_epoch=samples_per_epoch, index_dir=index_dir,
                               index_missing=index_missing, length_from=length_from,
                               frames_per_second=frames_per_second, index_workers=index_workers,
                               verify=verify_shards, storage_options=storage_options, trust_catalog=trust_catalog,
                               retry=retry)
        return sources, sources.catalog
    return None, open_catalog(urls, index_dir=index_dir, index_missing=index_missing, length_from=length_from,
                              frames_per_second=frames_per_second, index_workers=index_workers,
                              url_hint=urls if isinstance(urls, str) else None, verify=verify_shards,
                              storage_options=storage_options, trust_catalog=trust_catalog, retry=retry)


def check_samples(catalog: Catalog, max_length: int | None, long_samples: str) -> None:
    """Refuse an empty catalog, and with ``long_samples="raise"`` one holding a sample over ``max_length``."""
    if catalog.num_samples == 0:
        raise ValueError(f"the {len(catalog.urls)} shards hold no samples; check the shard list")
    if long_samples == "raise":
        for i, url in enumerate(catalog.urls):
            too_long(catalog.lengths(i), max_length, long_samples, where=f" of shard {scrub_url(url)}")


def _as_list(sources: Any) -> list:
    return list(sources) if isinstance(sources, (list, tuple)) else [sources]


def _index_share(urls, rank, world_size, index_dir, length_from, frames_per_second, workers) -> None:
    """With index_missing under torch.distributed, each rank indexes 1/W of
    the missing local shards, then all meet at one barrier."""
    from ..shards.indexer import index_shards

    mine = [u for i, u in enumerate(expand_urls(urls)) if i % world_size == rank and is_local(u)]
    try:
        if mine:
            index_shards(mine, length_from=length_from or "json:duration", frames_per_second=frames_per_second,
                         index_dir=index_dir, workers=workers, progress=False)
    finally:
        torch.distributed.barrier()
