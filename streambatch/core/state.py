"""Resumable state: one protocol and one vocabulary for every stateful object.

``DynamicBatchSampler`` and ``StreamingBatches`` save the same keys, so code
that checkpoints either (or torchdata's ``StatefulDataLoader``) sees one
format. A state is plain ints and strings (JSON- and pickle-safe) and does not
depend on the rank, so rank 0's copy can be loaded on every rank.

What must match on resume: the world size and the fingerprint (data and
every planning setting, see ``PlanConfig.fingerprint``). ``epoch`` and
``step`` say where to resume; a later elastic resume across world sizes can
start from (epoch, step x world_size samples-steps, data fingerprint).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

STATE_VERSION = 2

# Keys of a state dict (both the sampler's and the streaming dataset's).
VERSION = "version"          # int: format version (STATE_VERSION)
EPOCH = "epoch"              # int: the epoch being trained
STEP = "step"                # int: global steps of that epoch already consumed (= this rank's batches)
WORLD_SIZE = "world_size"    # int: data-parallel ranks the plan was made for
SEED = "seed"                # int: planning seed
FINGERPRINT = "fingerprint"  # int: 63-bit hash of the data and every planning setting
CONFIG = "config"            # dict: the planning settings, by name (for messages naming what differs)
# streaming only
WORKER = "worker"            # int or None: the DataLoader worker whose position this is
NUM_WORKERS = "num_workers"  # int: that DataLoader's workers (0: main process)
SKIPPED = "skipped"          # int: samples skipped so far (on_error="skip"), all workers of this rank

# Older names still accepted when loading (version 1 sampler states).
ALIASES = {"batches_consumed": STEP}

# Epochs are bounded so that no layer (int64 shared memory, seeds) can wrap them.
MAX_EPOCH = 2**32 - 1


@runtime_checkable
class Stateful(Protocol):
    """An object whose position can be saved and restored (torchdata's protocol)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def read_state(state: Any, kind: str, required: tuple[str, ...], versions: tuple[int, ...] = (1, STATE_VERSION)
               ) -> dict[str, Any]:
    """Check a state's shape before anything is changed: a dict of a known
    version holding ``required`` keys (old names mapped through ``ALIASES``).

    Returns a new dict with the current key names. Raises ValueError naming
    the missing keys or the bad version.
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"not a {kind} state: expected a dict from {kind}.state_dict(), got "
                         f"{type(state).__name__} {state!r:.200}")
    out = {ALIASES.get(k, k): v for k, v in state.items()}
    version = out.get(VERSION, 1)  # version 1 sampler states had no version key
    if isinstance(version, bool) or not isinstance(version, numbers.Integral) or int(version) not in versions:
        raise ValueError(f"not a {kind} state of a version this streambatch reads ({VERSION}={version!r}; "
                         f"readable: {list(versions)}): was it saved by a newer streambatch?")
    missing = [k for k in required if k not in out]
    if missing:
        raise ValueError(f"not a {kind} state: missing key(s) {', '.join(missing)} (a {kind} state holds "
                         f"{', '.join(required)}); pass what {kind}.state_dict() returned")
    return out


def state_int(state: Mapping[str, Any], key: str, minimum: int = 0, maximum: int | None = None) -> int:
    """``state[key]`` as an int in [minimum, maximum], or a ValueError naming the key."""
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"state[{key!r}] must be an integer, got {value!r} ({type(value).__name__}); "
                         "was the state converted (e.g. through JSON with strings)?")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f", {maximum}"
        raise ValueError(f"state[{key!r}] = {value} is outside [{minimum}{upper}]")
    return value


def differences(saved: Any, current: Mapping[str, Any]) -> str:
    """'max_batch_tokens: saved 4000, now 3000; ...' for the settings that differ."""
    if not isinstance(saved, Mapping):
        return ""
    parts = [f"{k}: saved {saved[k]!r}, now {v!r}" for k, v in current.items() if k in saved and saved[k] != v]
    return "; ".join(parts)
