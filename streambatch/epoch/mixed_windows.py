"""A mix's epoch cut into windows before planning (pure numpy plus sidecar
lengths, through the catalog, ``windows.MixedShards``): the semantics are those
of ``streaming/shards/sources.py`` (cycles, per-epoch quotas, positions;
``streambatch.core.mix``).

The epoch is cut into ``J = max(1, E // window_samples)`` windows (``E`` the
epoch's samples); window ``j`` takes the ``j``-th ``1/J`` of every source's
range of stream positions, so each window mixes the sources in proportion
(up to rounding by one sample per source).

Stream: a mix's ``WindowInput`` stream: each window's share of every source, in epoch order."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..core.mix import cycle_order, stream_pieces
from .sample_loop import WindowInput
from .windows import MixedShards


def num_windows(samples: int, window_samples: int) -> int:
    return max(1, samples // window_samples)


def mixed_inputs(sc: MixedShards, window_samples: int, seed: int, epoch: int, shuffle: bool
                 ) -> Iterator[WindowInput]:
    """The epoch's windows (before planning): each holds the next
    ``1/J`` of every source's epoch range. Reads one window's sidecar lengths
    at a time (a shard's lengths are kept while consecutive windows use it)."""
    mix = sc.mix
    nwin = num_windows(mix.samples_per_epoch, window_samples)
    cache: dict[int, np.ndarray] = {}
    orders: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for j in range(nwin):
        ids, local, lens, used = [], [], [], set()
        for i, c in enumerate(mix.counts):
            a = epoch * c + (j * c) // nwin
            b = epoch * c + ((j + 1) * c) // nwin
            for cycle, lo, hi in stream_pieces(mix.sizes[i], a, b):
                order, edges = _cycle(sc, orders, i, cycle, seed, shuffle)
                # shards of this cycle overlapping sample positions [lo, hi)
                k = int(np.searchsorted(edges, lo, side="right")) - 1
                while k < order.shape[0] and edges[k] < hi:
                    s = int(order[k])
                    x, y = max(lo, int(edges[k])) - int(edges[k]), min(hi, int(edges[k + 1])) - int(edges[k])
                    if y > x:
                        if s not in cache:
                            cache[s] = sc.catalog.lengths(s)
                        used.add(s)
                        ids.append(np.full(y - x, s, dtype=np.int64))
                        local.append(np.arange(x, y, dtype=np.int64))
                        lens.append(cache[s][x:y])
                    k += 1
        for s in [s for s in cache if s not in used]:
            del cache[s]
        none = np.zeros(0, dtype=np.int64)
        yield WindowInput(j, np.concatenate([none] + ids), np.concatenate([none] + local),
                          np.concatenate([none] + lens).astype(np.int64, copy=False), j == nwin - 1)


def _cycle(sc: MixedShards, orders: dict, source: int, cycle: int, seed: int, shuffle: bool
           ) -> tuple[np.ndarray, np.ndarray]:
    """(shard order (global ids), (k + 1,) sample edges) of one source cycle,
    keeping only the latest cycle of each source."""
    key = (source, cycle)
    if key not in orders:
        for old in [k for k in orders if k[0] == source]:
            del orders[old]
        lo, hi = int(sc.bounds[source]), int(sc.bounds[source + 1])
        order = cycle_order(hi - lo, seed, source, cycle, shuffle) + lo
        edges = np.concatenate([[0], np.cumsum(sc.catalog.counts[order])]).astype(np.int64)
        orders[key] = (order, edges)
    return orders[key]


def source_of_shards(sc: MixedShards, shard_ids: np.ndarray) -> np.ndarray:
    """(n,) int64 source of each (global) shard id."""
    return np.searchsorted(sc.bounds, np.asarray(shard_ids, dtype=np.int64), side="right") - 1
