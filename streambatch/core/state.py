"""Resumable state: one protocol and one vocabulary for every stateful object.

``DynamicBatchSampler`` and ``StreamingBatches`` save the same keys, so code
that checkpoints either (or torchdata's ``StatefulDataLoader``) sees one
format. A state is plain ints and strings (JSON- and pickle-safe) and does not
depend on the rank, so rank 0's copy can be loaded on every rank.

What must match on resume: the fingerprint (data and every planning setting,
see ``PlanConfig.fingerprint``), taken at the saved world size. ``epoch`` and
``step`` say where to resume. A state saved at another world size resumes
elastically: the saver's run becomes a finished segment of the epoch and the
rest is planned for this world (``planners/elastic.py``); ``segments`` keeps
that history, a few ints per resize, and ``history`` a digest of it bound to
the fingerprint and the epoch, so an edited history is refused.

Every value of a state is checked before any planning work (a damaged or
edited state must not make a loader plan an epoch at a world size of 10**9):
types, then bounds that no state the library saved can exceed. With N the
epoch's samples (each step trains at least one of them, each once, so an
epoch has at most N steps) and W this world size:

- ``world_size`` and each segment's world size: [1, max(N, W, MAX_RANKS)];
- ``segments``: at most MAX_SEGMENTS, each of >= 1 step, their sum <= N;
- ``step``: [steps of ``segments``, N] (a DataLoader worker's next step: N + num_workers);
- ``epoch``: [0, MAX_EPOCH]; ``num_workers``: [1, 256]; ``worker``: [0, num_workers);
  ``skipped``: [0, MAX_COUNT]; ``history``: [0, 2**63).

The digest detects edits and damage; it is no signature (anyone running
streambatch can compute one), so the bounds also cap what a forged state
costs: at most a plan at max(N, W, MAX_RANKS) ranks.
"""

from __future__ import annotations

import numbers
import warnings
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
# elastic resume and mixing (present only when they apply)
SEGMENTS = "segments"        # list of [world_size, steps]: the epoch's runs at earlier world sizes, in order
SOURCES = "sources"          # list of [cycle, position]: where each mixed source's cycle stands at the epoch start
PLANS = "plans"              # int: the plan generation (PLAN_GENERATION) of the streambatch that saved the state
HISTORY = "history"          # int: 63-bit digest of (fingerprint, epoch, segments), written with segments; states
                             # saved before it existed have none and are checked by the bounds alone

# The generation of plans. Raise it in any change that plans an epoch of the same data and settings differently
# (the fingerprint covers data and settings, not the planner's code): a state saved mid-epoch by another generation
# resumes that epoch under this one's plan, which trains some of its samples twice and others not at all in that
# epoch; loading one warns (``PlanChangedWarning``). 1: issue 30's step limit and the shard windows' carry counted
# (states saved before had no generation: the plans of that time, which issue 30 and 32 changed).
PLAN_GENERATION = 1
# Planners whose plans no generation changed: the seed-exact greedy planner plans the seed's batches in every one.
UNCHANGED_PLANNERS = ("greedy",)

# Older names still accepted when loading (version 1 sampler states).
ALIASES = {"batches_consumed": STEP}

# Epochs are bounded so that no layer (int64 shared memory, seeds) can wrap them.
MAX_EPOCH = 2**32 - 1

# Bounds of a state's counters (``planners/elastic.py`` checks the history against them).
MAX_SEGMENTS = 64  # resizes one epoch can record: each costs a restart, so 64 is far beyond any real run
# A world larger than the epoch's samples plans a single padded step, so a saved world size (the saver's or
# a segment's) may exceed N; a state is refused above max(N, this world size, MAX_RANKS) (see ``max_world``).
MAX_RANKS = 2**16
# ``skipped`` is cumulative over every pass of the run, so the data bounds it not; it stays an int that JSON
# readers keep exact (and that 256 workers' counts summed still fit the int64 counters it is restored into).
MAX_COUNT = 2**53
# The likely cause of a value out of bounds, for every message naming one.
DAMAGED = "is it a state saved for other data or settings, or a damaged or edited one?"


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


class PlanChangedWarning(UserWarning):
    """A state saved mid-epoch by a streambatch that planned that epoch differently: its rest is planned anew."""


def warn_if_replanned(state: Mapping[str, Any], kind: str, planner: str, epoch: int, step: int) -> None:
    """Warn (``PlanChangedWarning``) when ``state`` (checked, current key names) was saved ``step`` > 0 steps
    into ``epoch`` by a streambatch of another plan generation (``PLAN_GENERATION``; none recorded: older
    than 2026-12-04) and ``planner`` is not one whose plans never changed. At an epoch's start (step 0) every
    generation resumes the same: nothing of it trained yet."""
    saved = state.get(PLANS)
    if step == 0 or saved == PLAN_GENERATION or planner in UNCHANGED_PLANNERS:
        return
    by = "before plan generations were recorded" if saved is None else f"with plan generation {saved!r:.20}"
    warnings.warn(
        f"{kind}: this state was saved {step} step(s) into epoch {epoch} by a streambatch {by}; this one plans "
        f"generation {PLAN_GENERATION}, whose plan of that epoch may differ (planner={planner!r}), so the rest of "
        f"epoch {epoch} is planned anew: some samples its first steps trained may be trained again and others not "
        "at all this epoch (the epochs after it are whole). To keep the epoch exactly once, finish it with the "
        "streambatch that saved the state, then upgrade; or accept it for this one epoch "
        "(warnings.filterwarnings('ignore', category=streambatch.PlanChangedWarning))", PlanChangedWarning,
        stacklevel=3)


def state_int(state: Mapping[str, Any], key: str, minimum: int = 0, maximum: int | None = None,
              why: str = "") -> int:
    """``state[key]`` as an int in [minimum, maximum], or a ValueError naming
    the key, the value, the range and the likely cause (``why``: what the
    bound comes from, for the message)."""
    if key not in state:
        raise ValueError(f"the state has no {key!r} (it holds {', '.join(map(repr, state))}); pass the whole dict "
                         f"that state_dict() returned, unedited")
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"state[{key!r}] must be an integer, got {value!r:.100} ({type(value).__name__}); "
                         "was the state converted (e.g. through JSON with strings)?")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f", {maximum}"
        raise ValueError(f"state[{key!r}] = {value} is outside [{minimum}{upper}]{why}; {DAMAGED}")
    return value


def max_world(samples: int, world_size: int) -> int:
    """The largest world size a state loaded at ``world_size`` over an epoch
    of ``samples`` may name (see ``MAX_RANKS``)."""
    return max(samples, world_size, MAX_RANKS)


def differences(saved: Any, current: Mapping[str, Any]) -> str:
    """'max_batch_tokens: saved 4000, now 3000; ...' for the settings that differ."""
    if not isinstance(saved, Mapping):
        return ""
    parts = [f"{k}: saved {saved[k]!r:.100}, now {v!r}" for k, v in current.items() if k in saved and saved[k] != v]
    return "; ".join(parts)
