"""The read-mode registry: the one place ``read_mode`` picks a strategy.

``READ_MODES[name]`` is a ``ReadMode``, registered by the module that holds its window loop:
``"sample"`` (``sample_loop.py``: each window planned across all ranks by the configured planner, a
rank reading its samples by offset) and ``"shard"`` (``shard_loop.py``: each rank trains a contiguous
piece of the window's samples, which it alone streams, planned by the shard-affine planner). Everything
that depends on the mode asks its record: the planner its windows are planned with (whose options the
configuration is checked against), its windows (one shard list or a mix), its default window, its
warm-up, whether a rank streams only its share, and what it adds to the fingerprint. ``resolve_mode``
turns the user's ``read_mode`` into one of them, once per dataset; nothing else compares ``read_mode``.

Stream: ``Window`` objects (a window's plan and each rank's reads), in epoch order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ReadMode:
    """One read mode's strategy.

    plain(counts, load_lengths, config, epoch, segments=(), window_of=None):
        one shard list's windows; ``window_of(W)`` is the window size a run at
        W ranks used (shard mode's default follows W).
    mixed(inputs, config, epoch, segments, source_of, num_sources): a mix's
        windows from its ``WindowInput`` stream (``mixed_windows.py``).
    default_window(W): ``window_samples`` when the user gives none, at W ranks.
    warm_up(config, W): load (or compile) the planner now, so DataLoader
        workers forked later inherit it instead of each loading it again.
    rank_share: each rank streams only its own share (1/W) of a window's shards.
    planner: the registered planner whose plans the windows are (its options
        are the ones the configuration is checked against); None: the
        configured planner.
    accepts: the ``planner=`` names this mode plans with ``planner`` (empty:
        any; ``planner`` None plans with the one chosen). Any other is refused
        with a ValueError naming these and the fix, never silently replaced.
    fingerprint_tag: added to a configuration's fingerprint key (none for
        ``"sample"``, so states saved before read modes existed still load).
    """

    name: str
    plain: Callable[..., Iterator[Any]]
    mixed: Callable[..., Iterator[Any]]
    default_window: Callable[[int], int]
    warm_up: Callable[[Any, int], None]
    rank_share: bool
    planner: str | None = None
    fingerprint_tag: tuple[str, ...] = ()
    accepts: tuple[str, ...] = ()

    def planner_for(self, planner: str) -> str:
        """The planner this mode plans with when the user chose ``planner``
        (a ValueError when the mode cannot plan with that choice)."""
        if self.accepts and planner not in self.accepts:
            names = " or ".join(repr(a) for a in self.accepts)
            raise ValueError(
                f"read_mode={self.name!r} plans every rank's own shards with the {self.planner!r} planner (its walk "
                f"of each rank's own samples); planner={planner!r} cannot plan it: use planner={names} (the same "
                f"walk; {self.accepts[0]!r} is the default) with read_mode={self.name!r}, or read_mode='sample' to "
                f"plan with {planner!r}")
        return self.planner or planner


# name -> ReadMode, in registration order (sample_loop.py, then shard_loop.py: epoch/__init__.py imports both)
READ_MODES: dict[str, ReadMode] = {}


def register_read_mode(mode: ReadMode) -> ReadMode:
    READ_MODES[mode.name] = mode
    return mode


def check_read_mode(mode: Any) -> str:
    """A read mode name, or ValueError listing the valid ones."""
    if not isinstance(mode, str) or mode not in READ_MODES:
        raise ValueError(
            f"read_mode must be one of {list(READ_MODES)} (or None to choose by URL: 'sample' for local files, "
            f"'shard' for remote or pipe: URLs), got {mode!r}"
        )
    return mode


def resolve_mode(read_mode: str | None, all_local: Callable[[], bool]) -> ReadMode:
    """The strategy of ``read_mode``; None picks ``"sample"`` when every shard
    is a local file (``all_local()``: seeks are free), else ``"shard"``."""
    if read_mode is None:
        read_mode = "sample" if all_local() else "shard"
    return READ_MODES[check_read_mode(read_mode)]


def iter_windows(counts: np.ndarray, load_lengths: Callable[[int], np.ndarray], config: Any,
                 epoch: int) -> Iterator[Any]:
    """Plan an epoch window by window, in ``config.read_mode``.

    counts: (S,) int64 samples per shard; load_lengths(shard) -> (n,) int64;
    config: a ``WindowConfig``. Holds one window's arrays (plus at most one
    step of carried samples and the held outliers).

    With shuffling, outliers (``outlier_limit``) are held back from window to window and
    planned together, in the last window or once they make a quarter of one:
    a step holding an outlier lasts as long as that sample alone, so outliers
    spread over every window would each set the time of a step of their own
    window (on Common Voice Pashto at W = 64, 20,000-sample windows without
    holding plan a 1.8x longer epoch than the whole corpus at once).
    Samples the long-sample policy leaves out (``config.limits.too_long``) are left out and counted.
    """
    yield from READ_MODES[config.read_mode].plain(counts, load_lengths, config, epoch)
