"""``njit`` for streambatch's kernels: Numba's, plus a cache that may fail to save.

Numba compiles a ``cache=True`` kernel, keeps it in memory, then writes it to
its cache folder (``NUMBA_CACHE_DIR``, else ``__pycache__`` beside the module).
When that write fails (a full disk: ENOSPC, a quota: EDQUOT, a folder that
turned read-only), Numba raises from the kernel's first call, although the
kernel compiled and would run: the first plan dies of a disk problem. Here
such an error costs one warning naming the folder and the fix, and this
process stops trying to save kernels; the plan goes on. Any other error of
the save (a bug) still raises.

Kernel modules import ``njit`` from here instead of from numba; everything
else about the kernels (module level, ``cache=True``, arrays in and out) is
unchanged.
"""

from __future__ import annotations

import errno
import functools
import os
from typing import Any

from numba import njit as _numba_njit

from .compile_once import warn_once

# Errors of writing a file that are about the disk, not the kernel.
CACHE_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
_disabled = False  # set after the first failed save: the folder cannot take kernels, stop trying


def njit(*args: Any, **kwargs: Any) -> Any:
    """``numba.njit`` (same arguments); with ``cache=True`` the kernel's cache saves are guarded."""
    if args and callable(args[0]) and len(args) == 1 and not kwargs:  # bare @njit
        return _numba_njit(args[0])
    decorate = _numba_njit(*args, **kwargs)
    if not kwargs.get("cache"):
        return decorate

    def cached(fn: Any) -> Any:
        return guard_cache(decorate(fn))

    return cached


def guard_cache(dispatcher: Any) -> Any:
    """Make ``dispatcher``'s cache saves fail soft (see the module docstring); returns it."""
    cache = getattr(dispatcher, "_cache", None)
    save = getattr(cache, "save_overload", None)
    if save is None or getattr(save, "_streambatch_guard", False):
        return dispatcher

    @functools.wraps(save)
    def guarded(sig: Any, data: Any) -> None:
        global _disabled
        if _disabled:
            return
        try:
            save(sig, data)
        except OSError as exc:
            if exc.errno not in CACHE_WRITE_ERRORS:
                raise
            _disabled = True
            folder = getattr(cache, "_cache_path", None) or os.environ.get("NUMBA_CACHE_DIR") or "its cache folder"
            warn_once("cache-save", f"Numba compiled streambatch's kernels but cannot keep them in {folder} "
                                    f"({exc.strerror or exc}): planning goes on, and every new process compiles "
                                    "them again (20-60 s). Free space there, or point NUMBA_CACHE_DIR at a "
                                    "writable folder with room and run `streambatch warmup` once")

    guarded._streambatch_guard = True  # type: ignore[attr-defined]
    cache.save_overload = guarded
    return dispatcher
