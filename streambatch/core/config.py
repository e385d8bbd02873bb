"""One validated planning configuration, shared by ``make_plan``, the sampler,
the streaming dataset (``WindowConfig`` adds its window) and the command line.

Build it with ``PlanConfig.build(...)``: every value is checked once there,
and the planner's options are resolved once (``resolved_options``: checked,
defaults filled in; ``limits``: the batch rule they make, ``core/constraint.py``),
so code holding a ``PlanConfig`` never re-validates it. The dataclass is
frozen; ``replace`` builds (and checks) a modified copy.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

import numpy as np

from .constraint import BatchLimits
from .keywords import misspelled
from .limits import LimitCurve
from .long_samples import DEFAULT_POLICY, check_long_samples
from .plan import config_fingerprint
from .registry import check_planner, get_planner
from .state import MAX_EPOCH
from .types import FlagLike, IntLike, NumberLike
from .validation import check_budget, check_flag, check_int, check_seed

C = TypeVar("C", bound="PlanConfig")


def check_epoch(epoch: Any, name: str = "epoch") -> int:
    """An epoch as an int in [0, MAX_EPOCH] (bounded so nothing downstream wraps it)."""
    if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {epoch!r} ({type(epoch).__name__})")
    epoch = int(epoch)
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"{name} must be in [0, 2**32 - 1], got {epoch}; count epochs from 0")
    return epoch


@dataclass(frozen=True)
class PlanConfig:
    """Everything besides lengths, epoch and rank that a plan depends on.

    planner_options: the planner's keyword options as sorted (name, value)
    pairs (hashable; ``options`` gives them as a dict).
    long_samples: the long-sample policy (``core/long_samples.py``:
    ``"warn"``, ``"drop"``, ``"raise"``), in the batch rule (``limits``).
    """

    max_batch_tokens: int
    max_batch_size: int = 64
    world_size: int = 1
    shuffle: bool = True
    drop_last: bool = False
    seed: int = 42
    planner: str = "greedy"
    planner_options: tuple[tuple[str, Any], ...] = ()
    long_samples: str = DEFAULT_POLICY

    @classmethod
    def build(cls: type[C], max_batch_tokens: NumberLike, max_batch_size: IntLike = 64, world_size: IntLike = 1,
              shuffle: FlagLike = True, drop_last: FlagLike = False, seed: IntLike = 42, planner: str = "greedy",
              planner_options: Mapping[str, Any] | None = None, long_samples: str = DEFAULT_POLICY,
              **extra: Any) -> C:
        """Validate and coerce every setting (TypeError/ValueError naming the
        bad one). ``extra`` holds a subclass's own settings."""
        if planner_options is None:
            planner_options = {}
        if not isinstance(planner_options, Mapping):
            raise TypeError(f"planner_options must be a dict of keyword options, got {planner_options!r}")
        bad = [k for k in planner_options if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise TypeError(f"planner option names must be identifiers, got {bad[0]!r}")
        takes = [k for k in inspect.signature(cls._check_extra).parameters]
        wrong = [k for k in extra if k not in takes]
        if wrong:
            raise TypeError(f"{cls.__name__}.build got unexpected keyword(s) {wrong}{misspelled(wrong, takes)}")
        name = check_planner(planner)
        p = get_planner(cls._options_planner(name, extra))
        # Checked against the planner's declared options; only the options given are kept (with
        # their checked values), so defaults stay out of fingerprints and states.
        resolved = p.resolve(planner_options)
        given = {k: resolved[k] for k in planner_options}
        config = cls(
            max_batch_tokens=check_budget(max_batch_tokens),
            max_batch_size=check_int("max_batch_size", max_batch_size, 1),
            world_size=check_int("world_size", world_size, 1),
            shuffle=check_flag("shuffle", shuffle),
            drop_last=check_flag("drop_last", drop_last),
            seed=check_seed(seed),
            planner=name,
            planner_options=tuple(sorted(given.items())),
            long_samples=check_long_samples(long_samples),
            **cls._check_extra(**extra),
        )
        object.__setattr__(config, "_resolved", resolved)  # resolved once: what resolved_options returns
        config.limits  # noqa: B018 (a cost cap no batch fits under raises here, naming the value)
        return config

    @classmethod
    def _check_extra(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def _options_planner(cls, planner: str, extra: Mapping[str, Any]) -> str:
        """The planner whose declared options ``planner_options`` are checked against."""
        return planner

    @property
    def options(self) -> dict[str, Any]:
        """The planner's keyword options, as given."""
        return dict(self.planner_options)

    @property
    def options_planner(self) -> str:
        """The planner whose declared options ``planner_options`` were checked against (and
        whose plans these settings make): ``planner``, unless a subclass plans with another."""
        return self._options_planner(self.planner, self.__dict__)

    @property
    def resolved_options(self) -> dict[str, Any]:
        """The planner's options checked, defaults filled in: resolved once, by ``build`` (a
        copy made by ``dataclasses.replace`` resolves its own on first use). Read-only."""
        got = self.__dict__.get("_resolved")
        if got is None:
            got = get_planner(self.options_planner).resolve(self.options)
            object.__setattr__(self, "_resolved", got)
        return got

    @property
    def limits(self) -> BatchLimits:
        """The batch rule these settings make (budget, cap, cost model, cost cap, packing,
        long-sample limit), built once per configuration: what each plan binds to its lengths."""
        got = self.__dict__.get("_limits")
        if got is None:
            # max_length: a WindowConfig's long-sample limit (a PlanConfig has none)
            got = get_planner(self.options_planner).limits(self.max_batch_tokens, self.max_batch_size,
                                                           self.resolved_options, getattr(self, "max_length", None),
                                                           self.long_samples)
            object.__setattr__(self, "_limits", got)
        return got

    def replace(self: C, **changes: Any) -> C:
        """A checked copy with some settings changed."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["planner_options"] = dict(values["planner_options"])
        values.update(changes)
        return type(self).build(**values)

    def key(self) -> tuple:
        """The values the fingerprint hashes. This order (and the options as
        the repr of a sorted list) is the sampler's version-1 scheme, so its
        old states still load. A limit curve enters as its ``digest`` (its
        repr shows only a few breakpoints): plans under other curves differ."""
        key = (self.max_batch_tokens, self.max_batch_size, self.shuffle, self.drop_last, self.world_size,
               self.seed, self.planner, options_repr(self.planner_options))
        # the long-sample policy only where it changes plans ("drop"), so that earlier states still load
        return key + ("long_samples", self.long_samples) if self.long_samples == "drop" else key

    def fingerprint(self, data: np.ndarray | str) -> int:
        """The one fingerprint scheme of saved states and cross-rank checks:
        a 63-bit hash of the data's identity (the (N,) int64 lengths, or a
        digest string of shards and sidecars) and of ``key()``."""
        if isinstance(data, str):
            data = np.frombuffer(data.encode(), dtype=np.uint8).astype(np.int64)
        return config_fingerprint(data, *self.key())

    def describe(self) -> dict[str, Any]:
        """The settings as plain values (ints, bools, strings), e.g. for a state
        dict, so a mismatch can be reported setting by setting."""
        out = asdict(self)
        out["planner_options"] = options_repr(self.planner_options)
        if self.long_samples == DEFAULT_POLICY:  # as in key(): states saved before the policy existed compare alike
            del out["long_samples"]
        return out


def options_repr(options: tuple[tuple[str, Any], ...]) -> str:
    """The planner options as the fingerprint and states hold them: the repr of
    the sorted (name, value) list, a limit curve as ``LimitCurve(<digest>)``."""
    shown = [(k, f"LimitCurve({v.digest()})" if isinstance(v, LimitCurve) else v) for k, v in options]
    return repr(shown)
