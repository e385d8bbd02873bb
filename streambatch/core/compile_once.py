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

The lock is an aid, never a gate:

- the holder writes its pid (with its start time and host) into the lock
  file; a waiter whose holder is stopped (SIGSTOP, Ctrl-Z, a debugger: state
  ``T`` in ``/proc``) stops waiting at once, and any waiter stops after
  ``STREAMBATCH_COMPILE_WAIT`` seconds (default 300: a cold compile takes
  20-60 s); it then compiles alone, with one warning naming the lock file;
- a folder where the lock cannot be made (read-only, full) or a file system
  without ``flock`` (``ENOLCK``: NFSv3 without lockd; ``ENOSYS``/``EOPNOTSUPP``:
  Lustre without ``-o flock``) costs one warning naming ``NUMBA_CACHE_DIR``
  and the fix, and each process compiles for itself;
- a cache Numba cannot save into (a full disk) costs one warning too
  (``core/jit.py``): the kernels compiled, only keeping them failed.

Numba's own cache rules still decide what is valid (``cache=True``: the
kernel source's time stamp and size, Numba's version, the CPU): the lock
only orders the processes, so a stale or missing lock file at worst lets
processes compile side by side, as without it. Set
``STREAMBATCH_COMPILE_LOCK=0`` to turn the lock off. POSIX only (``fcntl``);
elsewhere each process compiles as without it.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Hashable

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

_done: set[Hashable] = set()  # (group, key) warmed in this process (inherited by forked workers)
_warned: set[str] = set()  # the warnings this process gave (each once)
_alone: set[str] = set()  # groups this process compiles without the lock (it could not be used)
DEFAULT_WAIT_S = 300.0
_POLL_S = 0.05
# flock errors that mean "this file system cannot lock", not "someone holds it"
_NO_LOCKING = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


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


def warn_once(key: str, message: str) -> None:
    """A RuntimeWarning, at most once per process for ``key``."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def compile_once(group: str, key: Hashable, warm: Callable[[], object]) -> None:
    """Run ``warm`` once per process for (group, key), under the node lock of
    ``group`` (see the module docstring). ``warm`` must be cheap once the
    kernels are compiled."""
    if (group, key) in _done:
        return
    if fcntl is None or os.environ.get("STREAMBATCH_COMPILE_LOCK", "1") == "0" or group in _alone:
        warm()
    else:
        _warm_locked(group, warm)
    _done.add((group, key))


def _fix(folder: str) -> str:
    return (f"point NUMBA_CACHE_DIR at a writable folder on a node-local disk with room (it is "
            f"{os.environ.get('NUMBA_CACHE_DIR') or 'not set: ' + folder + ' is used'}) and run `streambatch "
            "warmup` there once, or set STREAMBATCH_COMPILE_LOCK=0 to skip the lock")


def _warm_locked(group: str, warm: Callable[[], object]) -> None:
    folder = lock_dir()
    path = os.path.join(folder, f"streambatch-{group}.lock")
    try:
        os.makedirs(folder, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            # read-only suffices for flock: another user's lock file (in a shared cache) still locks
            fd = os.open(path, os.O_RDONLY)
    except OSError as exc:  # a read-only or full folder: no lock, compile as without it
        _alone.add(group)
        warn_once("folder", f"streambatch cannot make its compile lock {path} ({exc.strerror or exc}): each "
                            "process compiles the planners' kernels for itself, and Numba may not be able to keep "
                            f"them in its cache there either (then every process compiles them: 20-60 s). "
                            f"Planning goes on; to fix it, {_fix(folder)}")
        warm()
        return
    try:
        if not _acquire(fd, path, group, folder):
            _alone.add(group)
        warm()
    finally:
        os.close(fd)  # releases the lock


def _acquire(fd: int, path: str, group: str, folder: str) -> bool:
    """Lock ``fd``: exclusively when free (this process compiles, recording itself), else shared once the
    holder is done. False when the lock cannot be used (no flock, a stopped or slow holder): then this process
    compiles alone, after one warning."""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # first: compile (or load) for everyone
            _record(fd)
            return True
        except BlockingIOError:
            pass
        # Another process is compiling: wait for it, then load what it wrote (shared: waiters load side by side)
        limit = _wait_limit()
        end = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
            holder = _read_record(path)
            why = _stalled(holder)
            if why is None and time.monotonic() >= end:
                who = f"pid {holder[0]} on {holder[2]}" if holder else "a process that left no record"
                why = f"its holder ({who}) has not finished within {limit:g} s (STREAMBATCH_COMPILE_WAIT)"
            if why is not None:
                warn_once(f"stalled:{path}", f"streambatch's compile lock {path} is held, but {why}: this process "
                                             "compiles the planners' kernels alone (20-60 s) instead of waiting. "
                                             "Resume or end that process; a shared NUMBA_CACHE_DIR is best kept "
                                             "on a node-local disk")
                return False
            time.sleep(_POLL_S)
    except OSError as exc:
        if exc.errno not in _NO_LOCKING:
            raise
        warn_once("flock", f"streambatch cannot lock {path} ({exc.strerror or exc}): the file system of the Numba "
                           "cache folder has no working flock (NFSv3 without lockd, Lustre without -o flock). "
                           f"Planning goes on, each process compiling for itself; to fix it, {_fix(folder)}")
        return False


def _wait_limit() -> float:
    text = os.environ.get("STREAMBATCH_COMPILE_WAIT", "")
    try:
        value = float(text) if text else DEFAULT_WAIT_S
    except ValueError:
        value = DEFAULT_WAIT_S
    return value if value >= 0 else DEFAULT_WAIT_S


def holder_record() -> str:
    """What a lock holder writes into the lock file: 'pid start-time host' (the start time in clock ticks
    since boot, from /proc, so that a reused pid is not mistaken for the holder; 0 where unknown)."""
    return f"{os.getpid()} {_start_time(os.getpid()) or 0} {socket.gethostname()}\n"


def _record(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_record().encode(), 0)
    except OSError:  # a read-only lock file (another user's), a full disk: waiters fall back on the time limit
        pass


def _read_record(path: str) -> tuple[int, int, str] | None:
    try:
        with open(path) as f:
            pid, start, host = f.read(256).split()
        return int(pid), int(start), host
    except (OSError, ValueError):
        return None


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _stalled(holder: tuple[int, int, str] | None) -> str | None:
    """Why the recorded holder cannot be making progress (stopped or traced), or None when it may be (or when
    that cannot be told: another host, no /proc, no record)."""
    if holder is None or holder[2] != socket.gethostname():
        return None
    pid, start, _ = holder
    fields = _proc_stat(pid)
    if fields is None or (start and int(fields[19]) != start):
        return None  # gone or another process: the lock is about to be released (or is held by a newer holder)
    if fields[0] in ("T", "t"):
        return f"its holder, pid {pid}, is stopped (state {fields[0]}: SIGSTOP, Ctrl-Z or a debugger)"
    return None


def reset() -> None:
    """Forget what this process warmed and warned about (tests)."""
    _done.clear()
    _warned.clear()
    _alone.clear()
