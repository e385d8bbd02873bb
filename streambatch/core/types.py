"""Type aliases of the public API's inputs.

The public functions check what they are given at run time (a ``TypeError``
or ``ValueError`` naming the value, the allowed range and the fix), so they
take anything a user may pass; these aliases say what a caller should pass,
so that a type checker catches the rest before the run does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, Union

import numpy as np

if TYPE_CHECKING:
    import torch

# An integer: a Python int or a numpy integer scalar (bool is refused).
IntLike: TypeAlias = int | np.integer
# A number of tokens or a rate: ints or floats, Python or numpy (max_batch_tokens is floored).
NumberLike: TypeAlias = int | float | np.integer | np.floating
# A flag: True or False (a numpy bool, 0 and 1 are taken too; strings are refused).
FlagLike: TypeAlias = bool | np.bool_
# (N,) per-sample lengths: a sequence of ints, a numpy array of integers (or of
# integral floats), or a torch tensor (moved to the CPU). Union, not |: torch
# is named as a string, so that planning does not import it.
LengthsLike: TypeAlias = Union[Sequence[int], Sequence[float], np.ndarray, "torch.Tensor"]
# Shard URLs: a brace pattern (``train-{000000..000099}.tar``), a path or URL, or a list of them.
UrlsLike: TypeAlias = str | os.PathLike | Sequence[str | os.PathLike]
# How a sample's length is computed while indexing: ``"json:duration"``,
# ``"audio"``, ... (see ``length_spec``), a function of the raw sample dict
# (suffix -> member bytes; returning seconds with ``frames_per_second``, else a
# length), or a LengthSpec (``streaming/shards/lengths.py``; named here by
# what it does, so that this layer does not import streaming).


class LengthSpecLike(Protocol):
    """What ``streaming.shards.lengths.LengthSpec`` offers the indexer."""

    def describe(self) -> str: ...

    def wants(self, suffix: str) -> bool: ...


LengthFrom: TypeAlias = str | Callable[[dict[str, bytes]], float] | LengthSpecLike
