"""One compile per node: the first process to need a group of kernels
compiles them; the others wait for it and load its cache entries.

A cold Numba cache (a fresh container, a new install) costs each process
several CPU seconds of compiling on its first plan. When every rank and
worker of a node starts at once, they all compile the same kernels at once,
contending for the same cores. ``compile_once(group, key, warm)`` runs
``warm`` (tiny calls of the group's kernels with the argument types the
real call will use) under a file lock beside the cache, once per process and
key: one process takes the lock exclusively and compiles into the shared
cache, the processes that arrive meanwhile wait on a shared lock and then
load what it wrote, all in parallel. On a warm cache the lock costs nothing
but the loads that would happen anyway.

Numba's own cache rules still decide what is valid (``cache=True``: the
kernel source's time stamp and size, Numba's version, the CPU): the lock
only orders the processes, so a stale or missing lock file at worst lets
processes compile side by side, as without it. Set
``STREAMBATCH_COMPILE_LOCK=0`` to turn the lock off. POSIX only (``fcntl``);
elsewhere each process compiles as without it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Hashable

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

_done: set[Hashable] = set()  # (group, key) warmed in this process (inherited by forked workers)


def lock_dir() -> str:
    """Where the lock files live: the folder Numba caches streambatch's
    kernels in (``NUMBA_CACHE_DIR``, else the package's ``__pycache__`` when
    writable), else the temporary folder."""
    from numba.core.config import CACHE_DIR  # numba is loaded by then: the kernels imported it

    if CACHE_DIR:
        return CACHE_DIR
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__pycache__")
    if os.path.isdir(here) and os.access(here, os.W_OK):
        return here
    return tempfile.gettempdir()


def compile_once(group: str, key: Hashable, warm: Callable[[], object]) -> None:
    """Run ``warm`` once per process for (group, key), under the node lock of
    ``group`` (see the module docstring). ``warm`` must be cheap once the
    kernels are compiled."""
    if (group, key) in _done:
        return
    if fcntl is None or os.environ.get("STREAMBATCH_COMPILE_LOCK", "1") == "0":
        warm()
    else:
        _warm_locked(group, warm)
    _done.add((group, key))


def _warm_locked(group: str, warm: Callable[[], object]) -> None:
    try:
        os.makedirs(lock_dir(), exist_ok=True)
        # read-only suffices for flock: another user's lock file (in a shared cache) still locks
        fd = os.open(os.path.join(lock_dir(), f"streambatch-{group}.lock"), os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError:  # a read-only folder: no lock, compile as without it
        warm()
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # first: compile (or load) for everyone
        except BlockingIOError:
            # Another process is compiling: wait for it, then load what it wrote
            # (shared: the waiters load side by side).
            fcntl.flock(fd, fcntl.LOCK_SH)
        warm()
    finally:
        os.close(fd)  # releases the lock


def reset() -> None:
    """Forget what this process warmed (tests)."""
    _done.clear()

