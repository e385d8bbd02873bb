"""The planner registry: planner name -> ``Planner`` record (``planners/base.py``).

The dict lives here, below the planners, so that ``PlanConfig.build`` (this layer)
can check a planner's name and options without importing ``streambatch.planners``,
which builds on this layer. ``streambatch.planners`` fills it with the built-in
planners when it is imported, and ``streambatch/__init__.py`` imports it first
thing, so the registry is full before any ``streambatch.*`` module can run
(importing a submodule runs the package's ``__init__`` first).
``register_planner`` (``streambatch.planners``) adds more; ``PLANNERS`` there is
this same dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class PlannerRecord(Protocol):
    """What this layer asks of a registered planner (``planners.base.Planner``)."""

    name: str

    def resolve(self, options: Mapping[str, Any]) -> dict[str, Any]: ...

    def limits(self, max_batch_tokens: int, max_batch_size: int, resolved: Mapping[str, Any],
               max_length: int | None = None) -> Any: ...


# name -> Planner (the planners layer's record)
PLANNERS: dict[str, Any] = {}


def check_planner(name: Any) -> str:
    """``name`` if it is a registered planner, else a ValueError listing them."""
    if not isinstance(name, str) or name not in PLANNERS:
        raise ValueError(f"planner must be one of {sorted(PLANNERS)}, got {name!r}")
    return name


def get_planner(name: str) -> Any:
    """The registered ``Planner`` record of ``name`` (checked)."""
    return PLANNERS[check_planner(name)]
