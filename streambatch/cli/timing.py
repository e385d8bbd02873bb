"""Planning-speed measurements of ``streambatch bench`` (``bench/planning.py`` reuses them and adds its
at-scale row, which only the benchmark runs).

Speed is reported as ratios against the pure-Python seed algorithm
(``planners/greedy/reference.py``) run on the same lengths in the same process, plus
absolute warm times, peak memory and Numba compile times measured in fresh
processes. Nothing here is asserted: these are measurements.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable

import numpy as np

from ..core.units import seconds_to_frames
from ..planners import make_plan
from ..planners.greedy import reference

BUDGET = 16_000  # frames (50 frames/s: 320 s of audio per batch)
CAP = 64


def audio_lengths(n: int, seed: int = 0) -> np.ndarray:
    """(n,) int64 frame counts: log-normal durations clipped to 0.5-30 s at 50 frames/s."""
    rs = np.random.default_rng(seed)
    seconds = np.clip(rs.lognormal(np.log(5.0), 0.8, n), 0.5, 30.0)
    return seconds_to_frames(seconds, 50)


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of ``repeats`` wall-clock runs (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


def _trim() -> None:
    """Return freed heap memory to the OS. glibc keeps large freed blocks once
    its mmap threshold has grown, so without this a second plan of the same
    size reuses the first one's pages and seems to need no memory."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_growth(fn: Callable[[], object]) -> int | None:
    """Bytes the peak RSS rose above the current RSS while ``fn`` ran; None
    where /proc cannot tell (not Linux, or no permission to reset the mark)."""
    _trim()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        before = _status("VmRSS:")
    except OSError:
        fn()
        return None
    fn()
    return max(0, _status("VmHWM:") - before)


def versus_seed(n: int = 20_000, worlds: Iterable[int] = (1, 8, 16, 64), planners: Iterable[str] = ("greedy",),
                progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """Rows of {world_size, planner, seconds, seed_seconds, ratio} at ``n`` samples."""
    lengths = audio_lengths(n)
    as_list = lengths.tolist()
    rows = []
    for w in worlds:
        progress(f"pure-Python seed algorithm, N={n:,}, W={w}")
        t = time.perf_counter()
        reference.plan_steps(as_list, BUDGET, CAP, w, shuffle=True, seed=42, epoch=0)
        seed_s = time.perf_counter() - t
        for name in planners:
            progress(f"{name}, N={n:,}, W={w}")
            plan = functools.partial(make_plan, lengths, BUDGET, CAP, w, planner=name)
            plan()  # compile / load from cache
            s = best_time(plan, repeats=5)
            rows.append({"world_size": w, "planner": name, "seconds": s, "seed_seconds": seed_s,
                         "ratio": seed_s / s})
    return rows


_CHILD = r"""
import json, sys, time
import numpy as np

t0 = time.perf_counter()
from streambatch import make_plan
from streambatch.cli.timing import peak_growth
t_import = time.perf_counter() - t0
lengths = np.load(sys.argv[1])
w, planner, repeats = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
t = time.perf_counter()
make_plan(lengths[:1000], 16000, 64, w, planner=planner)
first = time.perf_counter() - t
best = float("inf")
growth = 0
for _ in range(repeats):
    t = time.perf_counter()
    growth = max(growth, peak_growth(lambda: make_plan(lengths, 16000, 64, w, planner=planner)) or 0)
    best = min(best, time.perf_counter() - t)
print(json.dumps({"import": t_import, "first_call": first, "seconds": best, "peak_bytes": growth}))
"""


def _child(lengths_path: str, world_size: int, planner: str, repeats: int, cache_dir: str | None = None) -> dict:
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", _CHILD, lengths_path, str(world_size), planner, str(repeats)],
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compile_times(planners: Iterable[str] = ("greedy",)) -> list[dict]:
    """Cold compile (empty Numba cache) and first call with a warm cache, fresh processes."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lengths.npy")
        np.save(path, audio_lengths(2000))
        for name in planners:
            cache = os.path.join(tmp, f"cache-{name}")
            cold = _child(path, 8, name, 1, cache_dir=cache)
            warm = _child(path, 8, name, 1, cache_dir=cache)
            rows.append({"planner": name, "cold_first_call": cold["first_call"],
                         "warm_first_call": warm["first_call"], "import": warm["import"]})
    return rows
