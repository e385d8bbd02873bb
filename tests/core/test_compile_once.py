"""``core/compile_once.py``: one compile per node, and warm-ups that compile
exactly the kernel signatures the real plans then call."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import numpy as np
import pytest

from streambatch import make_plan
from streambatch.core import compile_once as co
from streambatch.core.cost import CostModel


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(co, "lock_dir", lambda: str(tmp_path))
    co.reset()
    yield tmp_path
    co.reset()


def test_warm_runs_once_per_process_and_key(lock_dir):
    runs = []
    for _ in range(3):
        co.compile_once("g", ("int32", True), lambda: runs.append("a"))
    co.compile_once("g", ("int64", True), lambda: runs.append("b"))
    co.compile_once("h", ("int32", True), lambda: runs.append("c"))
    assert runs == ["a", "b", "c"]
    assert os.path.exists(lock_dir / "streambatch-g.lock")


def test_a_process_waits_while_another_compiles(lock_dir):
    # Another process compiling = an exclusive flock on the group's lock file.
    fd = os.open(lock_dir / "streambatch-g.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ran = threading.Event()
    t = threading.Thread(target=co.compile_once, args=("g", 1, ran.set))
    t.start()
    time.sleep(0.3)
    assert not ran.is_set()  # waiting for the compiler
    os.close(fd)  # it is done
    t.join(10)
    assert ran.is_set()


def test_waiters_load_side_by_side(lock_dir):
    # A shared holder (another process loading) does not block a new arrival.
    fd = os.open(lock_dir / "streambatch-g.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        ran = []
        t = threading.Thread(target=co.compile_once, args=("g", 2, lambda: ran.append(1)))
        t.start()
        t.join(10)
        assert ran == [1]
    finally:
        os.close(fd)


def test_lock_off_and_unwritable_folder(lock_dir, monkeypatch):
    fd = os.open(lock_dir / "streambatch-g.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        ran = []
        monkeypatch.setenv("STREAMBATCH_COMPILE_LOCK", "0")
        co.compile_once("g", 3, lambda: ran.append(1))  # would wait forever with the lock on
        assert ran == [1]
        monkeypatch.delenv("STREAMBATCH_COMPILE_LOCK")
        monkeypatch.setattr(co, "lock_dir", lambda: os.path.join(str(lock_dir), "streambatch-g.lock", "x"))
        co.compile_once("g", 4, lambda: ran.append(2))  # no folder to lock in: runs unlocked
        assert ran == [1, 2]
    finally:
        os.close(fd)


def test_warm_error_releases_the_lock(lock_dir):
    def boom():
        raise RuntimeError("compile failed")

    with pytest.raises(RuntimeError):
        co.compile_once("g", 5, boom)
    fd = os.open(lock_dir / "streambatch-g.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        os.close(fd)
    ran = []
    co.compile_once("g", 5, lambda: ran.append(1))  # not marked done: tried again
    assert ran == [1]


KERNELS = {
    "streambatch.planners.greedy.placement": ["greedy_steps"],
    "streambatch.planners.greedy.order": ["sortish_order"],
    "streambatch.planners.greedy.mt19937": ["shuffle_slice"],
    "streambatch.planners.bucketed.steps": ["bucket_sort", "plan_steps"],
    "streambatch.planners.toolkit": ["step_permutation"],
    "streambatch.planners.bucketed.packed_steps": ["pack_steps"],
}


def _lengths(n, lmax, seed=0):
    rs = np.random.default_rng(seed)
    x = rs.integers(0, 900, n)
    x[rs.integers(0, n, 3)] = lmax  # outliers set the length dtype (bucketed: int16 / int32)
    return x


@pytest.mark.parametrize("planner,options", [
    ("greedy", {}), ("bucketed", {}), ("bucketed", {"cost": "linear", "max_step_cost": 5e4}),
    ("bucketed", {"cost": CostModel.step(0.05, 2e-7, 1e-10)}), ("bucketed", {"pack": True}),
])
@pytest.mark.parametrize("lmax", [2000, 40_000])
@pytest.mark.parametrize("shuffle", [True, False])
def test_warm_up_calls_the_kernels_with_the_real_argument_types(lock_dir, monkeypatch, planner, options, lmax,
                                                                shuffle):
    """The tiny warm-up must reach every kernel with the argument types the real
    plan passes: a type it missed would compile again after the lock (or, worse,
    the warm-up would compile a signature nothing uses)."""
    import importlib

    seen: dict[str, list[set]] = {}  # kernel -> [types in the warm-up, types in the real plan]
    phase = {"now": 0}
    for mod_name, names in KERNELS.items():
        mod = importlib.import_module(mod_name)
        for name in names:
            kernel = getattr(mod, name)

            def spy(*args, _k=kernel, _n=name):
                seen.setdefault(_n, [set(), set()])[phase["now"]].add(tuple(_k.typeof_pyval(a) for a in args))
                return _k(*args)
            monkeypatch.setattr(mod, name, spy)
    real_compile_once = co.compile_once

    def warm_then_real(group, key, warm):
        real_compile_once(group, key, warm)
        phase["now"] = 1
    monkeypatch.setattr(co, "compile_once", warm_then_real)
    lengths = _lengths(5000, lmax)
    make_plan(lengths, 200_000, 64, 8, shuffle, True, 3, 1, planner=planner, **options)
    assert phase["now"] == 1 and seen
    for name, (warm, real) in seen.items():
        assert real and real <= warm, name
