"""Misspelled keywords: what the entry points' keywords are, and the one a wrong name most likely meant.

``make_plan``, ``DynamicBatchSampler`` and ``StreamingBatches`` pass every keyword they do not take on to the
planner as an option, so ``world_sise=2`` or ``batch_size=8`` arrives at the planner's option check
(``planners/base.Planner.resolve``) or at ``PlanConfig.build``; both name the keyword meant from here.
``max_batch_tokens`` defaults to ``REQUIRED`` rather than having no default, so that ``max_batch_token=16000``
reaches that check (and is named) instead of Python's "missing 1 required positional argument".
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

# Every keyword of make_plan, PlanConfig.build, DynamicBatchSampler and StreamingBatches
# (tests/planners/test_keyword_hints.py checks that the signatures hold no other).
ENTRY_KEYWORDS = (
    "lengths", "urls", "max_batch_tokens", "max_batch_size", "world_size", "rank", "shuffle", "drop_last", "seed",
    "epoch", "planner", "planner_options", "verify", "max_length", "long_samples", "mix", "window_samples",
    "read_mode", "index_dir", "index_missing", "length_from", "frames_per_second", "index_workers", "decode",
    "collate_fn", "on_error", "samples_per_epoch", "storage_options", "cache_dir", "prefetch_shards",
    "prefetch_bytes", "retry", "trust_catalog", "format", "index", "remote", "output",
)
# What other samplers and loaders call these settings.
KEYWORD_ALIASES = {
    "batch_size": "max_batch_size", "max_batch": "max_batch_size", "max_tokens": "max_batch_tokens",
    "batch_tokens": "max_batch_tokens", "max_frames": "max_batch_tokens", "max_duration": "max_batch_tokens",
    "num_replicas": "world_size", "world": "world_size", "num_ranks": "world_size", "drop_remainder": "drop_last",
    "random_seed": "seed",
}


class _Required:
    """The default of ``max_batch_tokens``: a value that is not one (see the module docstring)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()


def suggest(name: str, choices: Iterable[str]) -> str | None:
    """The keyword ``name`` most likely meant: a known alias, else the closest of ``choices`` and the entry
    points' keywords (None when nothing is close)."""
    if name in KEYWORD_ALIASES:
        return KEYWORD_ALIASES[name]
    close = difflib.get_close_matches(name, [*choices, *ENTRY_KEYWORDS], n=1, cutoff=0.75)
    return close[0] if close else None


def misspelled(unknown: Iterable[str], choices: Iterable[str]) -> str:
    """'; 'world_sise': did you mean world_size=?' for each unknown name with a likely meaning ('' if none)."""
    choices = list(choices)
    hints = [f"{name!r}: did you mean {meant}=?" for name in unknown if (meant := suggest(name, choices))]
    return "; " + "; ".join(hints) if hints else ""
