"""The compile lock is an aid, never a gate (issue 32, items 11-13).

- 11: a process stopped while it holds the lock (SIGSTOP: Ctrl-Z, a debugger) blocked every later first plan
  on the node forever; now a waiter sees the holder is stopped (its pid in the lock file, its state in /proc)
  and compiles alone, with one warning naming the lock file. A live holder is waited for, up to a bound.
- 12: a file system without flock (ENOLCK: NFSv3 without lockd; ENOSYS: Lustre without -o flock) made every
  first plan raise a bare OSError; now it plans, with one warning naming NUMBA_CACHE_DIR and the fix.
- 13: a full disk under the Numba cache made the first plan die with ENOSPC from Numba's caching code (the
  kernels had compiled); now it plans, with one warning. A read-only cache folder plans with one warning too.

Real processes here: a SIGSTOP'd holder, and (slow tier) fresh interpreters planning with NUMBA_CACHE_DIR on a
real tmpfs that is full or mounted read-only (a private mount namespace: ``unshare -rm``, so no root needed
where user namespaces are allowed; skipped, saying so, where they are not). The flock that fails is the one
simulated case: fcntl.flock is made to raise ENOLCK / ENOSYS.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

from streambatch.core import compile_once as co

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(co, "lock_dir", lambda: str(tmp_path))
    co.reset()
    yield tmp_path
    co.reset()


HOLDER = textwrap.dedent("""
    import os, signal, sys
    from streambatch.core import compile_once as co
    co.lock_dir = lambda: sys.argv[1]
    def stop():
        open(os.path.join(sys.argv[1], "holding"), "w").close()
        os.kill(os.getpid(), signal.SIGSTOP)  # Ctrl-Z in the middle of compiling
    co.compile_once("g", "k", stop)
""")


def start_stopped_holder(directory) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], env=env)
    end = time.monotonic() + 60
    while not os.path.exists(os.path.join(directory, "holding")) or _state(proc.pid) not in "Tt":
        if time.monotonic() > end or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the holder did not take the lock and stop")
        time.sleep(0.02)
    return proc


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc to see the holder's state")
@pytest.mark.timeout(120, method="thread")  # before the fix: blocked forever
def test_a_stopped_holder_does_not_block_the_next_plan(lock_dir):
    holder = start_stopped_holder(lock_dir)
    try:
        ran = []
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            co.compile_once("g", "k", lambda: ran.append(1))
            co.compile_once("g", "k2", lambda: ran.append(2))  # another key of the group: no second warning
        assert ran == [1, 2] and time.monotonic() - t0 < 20
        said = [str(w.message) for w in caught]
        assert len(said) == 1, said
        assert str(lock_dir / "streambatch-g.lock") in said[0] and f"pid {holder.pid}" in said[0]
        assert "stopped" in said[0]
    finally:
        holder.kill()
        holder.wait()


def test_a_live_holder_is_waited_for_then_its_work_loaded(lock_dir):
    fd = os.open(lock_dir / "streambatch-g.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, co.holder_record().encode())  # this process, running: a holder making progress
    ran = threading.Event()
    t = threading.Thread(target=co.compile_once, args=("g", 1, ran.set))
    t.start()
    time.sleep(0.5)
    assert not ran.is_set()  # waiting for the compiler
    os.close(fd)
    t.join(10)
    assert ran.is_set()


def test_a_live_holder_past_the_bound_is_left_behind_with_one_warning(lock_dir, monkeypatch):
    monkeypatch.setenv("STREAMBATCH_COMPILE_WAIT", "0.5")
    fd = os.open(lock_dir / "streambatch-g.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # no record: a holder of unknown state (another host, an old version)
    try:
        ran = []
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match=r"streambatch-g.lock.*0.5 s.*STREAMBATCH_COMPILE_WAIT") as caught:
            co.compile_once("g", 2, lambda: ran.append(1))
        assert ran == [1] and 0.4 < time.monotonic() - t0 < 10 and len(caught) == 1
    finally:
        os.close(fd)


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS])
def test_a_lock_call_that_fails_plans_anyway_with_one_warning(lock_dir, monkeypatch, code):
    def no_flock(fd, op):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(co.fcntl, "flock", no_flock)
    ran = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        co.compile_once("g", 3, lambda: ran.append(1))
        co.compile_once("h", 3, lambda: ran.append(2))
    assert ran == [1, 2]
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "NUMBA_CACHE_DIR" in said[0] and os.strerror(code) in said[0], said
    assert "STREAMBATCH_COMPILE_LOCK=0" in said[0]


def test_an_unwritable_lock_folder_plans_with_one_warning(lock_dir, monkeypatch):
    monkeypatch.setattr(co, "lock_dir", lambda: os.path.join(str(lock_dir), "file", "x"))
    (lock_dir / "file").write_text("not a folder")
    ran = []
    with pytest.warns(RuntimeWarning, match="NUMBA_CACHE_DIR") as caught:
        co.compile_once("g", 4, lambda: ran.append(1))
        co.compile_once("g", 5, lambda: ran.append(2))
    assert ran == [1, 2] and len(caught) == 1


def test_a_cache_that_cannot_be_saved_costs_one_warning_not_the_plan(monkeypatch):
    """The guard on every kernel's cache (core/jit.py), on a kernel defined here; the real full disk is the
    slow test below."""
    from streambatch.core import jit

    monkeypatch.setattr(jit, "_disabled", False)
    monkeypatch.setattr(co, "_warned", set())

    @jit.njit(cache=True)
    def plus_one(x):
        return x + 1

    @jit.njit(cache=True)
    def plus_two(x):
        return x + 2

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    for k in (plus_one, plus_two):
        monkeypatch.setattr(k._cache._cache_file, "save", full)
    with pytest.warns(RuntimeWarning, match=r"No space left.*NUMBA_CACHE_DIR") as caught:
        assert plus_one(1) == 2 and plus_two(1) == 3
    assert len(caught) == 1


def test_every_kernel_module_takes_njit_from_core_jit():
    """The guard covers a kernel only if its module's ``njit`` is core/jit.py's: no module but core/jit.py
    imports numba's own (kernel modules move and new ones come: this finds them wherever they are)."""
    import ast

    import streambatch

    root = os.path.dirname(streambatch.__file__)
    direct, guarded = [], []
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and any(a.name == "njit" for a in node.names):
                    (direct if node.module == "numba" else guarded).append(rel)
    assert direct == [os.path.join("core", "jit.py")], direct
    # the kernels of every planner, the toolkit (which re-exports it), core's hashing and shuffles
    assert {os.path.join("planners", "toolkit.py"), os.path.join("planners", "shard_affine", "walk.py"),
            os.path.join("planners", "greedy", "placement.py"), os.path.join("core", "hashing.py")} <= set(guarded)


# ---------------------------------------------------------------- a real full / read-only tmpfs (slow tier)

PLAN = textwrap.dedent("""
    import warnings
    import numpy as np
    warnings.simplefilter("always")
    from streambatch import DynamicBatchSampler, make_plan
    lengths = np.random.default_rng(0).integers(50, 1500, 3000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = len(DynamicBatchSampler(lengths, 16000, 64, world_size=2, rank=1, planner="bucketed"))
        m = make_plan(lengths, 16000, 64, 2, planner="greedy").num_steps
        k = make_plan(lengths, 16000, 64, 2, planner="bucketed", pack=True).num_steps
    print("planned", n, m, k)
    for w in caught:
        print("WARNING", w.category.__name__, str(w.message).replace(chr(10), " "))
""")


def _namespaced(script: str, tmp_path, setup: str) -> subprocess.CompletedProcess:
    """Run ``script`` with NUMBA_CACHE_DIR on a fresh 1 MiB tmpfs, after ``setup`` (shell), in a private
    user + mount namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not allowed here ({probe.stderr.decode().strip()})")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (tmp_path / "plan.py").write_text(script)
    inner = (f"mount -t tmpfs -o size=1m tmpfs {mnt} && {setup} && "
             f"NUMBA_CACHE_DIR={mnt}/numba {sys.executable} {tmp_path / 'plan.py'}")
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("NUMBA_CACHE_DIR", None)
    return subprocess.run(["unshare", "-rm", "sh", "-c", inner], capture_output=True, text=True, env=env,
                          timeout=900)


def _planned(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out.stderr[-3000:]
    assert "planned" in out.stdout, out.stdout + out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.startswith("WARNING")]


@pytest.mark.slow  # a cold compile of every planner in a fresh interpreter (~1 min on 2 cores)
def test_a_full_cache_disk_plans_with_one_warning(tmp_path):
    mnt = tmp_path / "mnt"
    fill = f"mkdir {mnt}/numba && (dd if=/dev/zero of={mnt}/fill bs=4k 2>/dev/null || true) && test ! -s /dev/null"
    said = _planned(_namespaced(PLAN, tmp_path, fill))
    assert len(said) == 1, said
    assert "No space left on device" in said[0] and "NUMBA_CACHE_DIR" in said[0] and f"{mnt}/numba" in said[0]


@pytest.mark.slow
def test_a_read_only_cache_folder_plans_with_one_warning(tmp_path):
    mnt = tmp_path / "mnt"
    ro = f"mkdir {mnt}/numba && mount -o remount,ro {mnt}"
    said = _planned(_namespaced(PLAN, tmp_path, ro))
    assert len(said) == 1, said
    assert "NUMBA_CACHE_DIR" in said[0] and f"{mnt}/numba" in said[0]
