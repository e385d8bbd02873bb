"""The read-mode registry: the one place ``read_mode`` picks a strategy.

``READ_MODES[name]`` is a ``ReadMode``: its ``plain`` plans one shard list's
epoch and ``mixed`` a mix's (``mixes.py``), both with the elastic
``segments`` of a resumed epoch; ``default_window`` is its window size when
the user gives none, ``warm_up`` loads its planner before DataLoader workers
fork, and ``rank_share`` says whether each rank streams only its own share
of a window's bytes. ``"sample"``: each window planned across all ranks
(``sample_mode.py``); ``"shard"``: each rank trains a contiguous piece of the
window's shards (``shard_mode.py``). ``resolve_mode`` turns the user's
``read_mode`` into one of them, once per dataset; ``iter_windows`` and
``summarize`` dispatch on a config's; nothing else compares ``read_mode`` to
choose a loop.

Stream: ``Window`` objects (a window's plan and each rank's reads), in epoch order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ...planners import plan_epoch
from ...planners.elastic import Segments
from .affinity.plan import warm_up as warm_up_affine
from .sample_mode import WindowInput, plain_inputs, plan_windows, summarize_windows
from .shard_mode import affine_windows, plan_affine
from .windows import EpochSummary, Window, WindowConfig, check_read_mode


def _sample_plain(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig, epoch: int,
                  segments: Segments = (), window_of: Callable[[int], int] | None = None) -> Iterator[Window]:
    # a replanned rest keeps the epoch's window size: window_of is shard mode's
    return plan_windows(plain_inputs(counts, load_lengths, config, epoch), config, epoch, segments)


def _sample_mixed(inputs: Iterator[WindowInput], config: WindowConfig, epoch: int, segments: Segments,
                  source_of: Callable[[np.ndarray], np.ndarray], num_sources: int) -> Iterator[Window]:
    return plan_windows(inputs, config, epoch, segments, source_of, num_sources)


def _shard_mixed(inputs: Iterator[WindowInput], config: WindowConfig, epoch: int, segments: Segments,
                 source_of: Callable[[np.ndarray], np.ndarray], num_sources: int) -> Iterator[Window]:
    return plan_affine(lambda _w: next(inputs, None), config, epoch, segments, source_of, num_sources)


def _warm_sample(config: WindowConfig, world_size: int) -> None:
    plan_epoch(np.ones(world_size, dtype=np.int64), config, 0)


def _warm_shard(config: WindowConfig, world_size: int) -> None:
    warm_up_affine(config.max_batch_tokens, config.max_batch_size, world_size, config.options)


@dataclass(frozen=True)
class ReadMode:
    """One read mode's strategy.

    plain(counts, load_lengths, config, epoch, segments=(), window_of=None):
        one shard list's windows; ``window_of(W)`` is the window size a run at
        W ranks used (shard mode's default follows W).
    mixed(inputs, config, epoch, segments, source_of, num_sources): a mix's
        windows from its ``WindowInput`` stream.
    default_window(W): ``window_samples`` when the user gives none, at W ranks.
    warm_up(config, W): load (or compile) the planner now, so DataLoader
        workers forked later inherit it instead of each loading it again.
    rank_share: each rank streams only its own share (1/W) of a window's shards.
    """

    name: str
    plain: Callable[..., Iterator[Window]]
    mixed: Callable[..., Iterator[Window]]
    default_window: Callable[[int], int]
    warm_up: Callable[[WindowConfig, int], None]
    rank_share: bool


# Window sizes when the user gives none: 20,000; in shard mode at least 2,500 per rank (each rank's own
# samples must be many enough to cut balanced batches from: see bench/affinity.py). Module-level functions,
# not lambdas: a dataset travels to spawned DataLoader workers by pickle.
def _sample_window(world_size: int) -> int:
    return 20_000


def _shard_window(world_size: int) -> int:
    return max(20_000, 2_500 * world_size)


READ_MODES: dict[str, ReadMode] = {
    "sample": ReadMode("sample", _sample_plain, _sample_mixed, _sample_window, _warm_sample, False),
    "shard": ReadMode("shard", affine_windows, _shard_mixed, _shard_window, _warm_shard, True),
}


def resolve_mode(read_mode: str | None, all_local: Callable[[], bool]) -> ReadMode:
    """The strategy of ``read_mode``; None picks ``"sample"`` when every shard
    is a local file (``all_local()``: seeks are free), else ``"shard"``."""
    if read_mode is None:
        read_mode = "sample" if all_local() else "shard"
    return READ_MODES[check_read_mode(read_mode)]


def iter_windows(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
                 epoch: int) -> Iterator[Window]:
    """Plan an epoch window by window.

    counts: (S,) int64 samples per shard; load_lengths(shard) -> (n,) int64.
    Holds one window's arrays (plus at most one step of carried samples and
    the held outliers).

    With shuffling, outliers (``outlier_limit``) are held back from window to window and
    planned together, in the last window or once they make a quarter of one:
    a step holding an outlier lasts as long as that sample alone, so outliers
    spread over every window would each set the time of a step of their own
    window (on Common Voice Pashto at W = 64, 20,000-sample windows without
    holding plan a 1.8x longer epoch than the whole corpus at once).
    Samples longer than ``config.max_length`` are left out and counted.
    """
    yield from READ_MODES[config.read_mode].plain(counts, load_lengths, config, epoch)


def summarize(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: WindowConfig,
              epoch: int) -> EpochSummary:
    """Plan the whole epoch (lengths only) and count what it trains on."""
    return summarize_windows(iter_windows(counts, load_lengths, config, epoch), int(counts.sum()), epoch, config)
