"""One log line before a cold Numba compile, so a first plan that takes a minute does not look hung.

A fresh environment compiles each planner's kernels once (20-60 s on 2 cores); Numba then keeps
the machine code in its cache (``__pycache__`` beside the package, or ``NUMBA_CACHE_DIR``) and
later processes load it in well under a second. Whether a kernel is cached is read from the
cache index file Numba writes per kernel; a kernel module is looked at once per process, and
the line is logged at most once per process. Importing ``streambatch`` imports none of this:
the kernel module is imported here just before the plan that would import it anyway.
"""

from __future__ import annotations

import importlib
import os

from ..core.redact import logger

log = logger("streambatch.planners")

_seen: set[str] = set()
_said = False


def notice_if_cold(kernels: str) -> None:
    """Log once if ``kernels`` (a planner's kernel module, ``Planner.kernels``; "" for none) has no
    kernel in Numba's cache, i.e. the coming plan compiles them."""
    global _said
    if _said or not kernels or kernels in _seen or not kernels.startswith("streambatch."):
        return
    _seen.add(kernels)
    folder = cold_cache(kernels)
    if folder is not None:
        _said = True
        log.warning("streambatch: compiling the planners with Numba (20-60 s). This happens once per environment: "
                    "the machine code is cached in %s for every later process (`streambatch warmup` compiles "
                    "everything ahead of time, e.g. in an image build)", folder)


def cold_cache(module: str) -> str | None:
    """The cache folder of ``module``'s ``cache=True`` kernels if none of them is cached yet (a fresh
    environment), else None. A kernel is cached once Numba wrote its index file; kernels a plan
    never called have none, so one cached kernel is taken to mean the environment is warm. None also
    when the module does not exist or Numba's cache layout is not the one expected."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    indexes = []
    for value in vars(mod).values():
        cache = getattr(value, "_cache", None)
        index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
        if isinstance(index, str) and getattr(value, "__module__", None) == module:
            indexes.append(index)
    if not indexes or any(os.path.exists(i) for i in indexes):
        return None
    return os.path.dirname(indexes[0])
