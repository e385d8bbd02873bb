"""Helpers shared by the tests: free ports, length generators, a dataset stub,
and the hypothesis example budget of the current tier."""

from __future__ import annotations

import os
import socket
import time

import numpy as np

# Set by conftest.py before any test module is imported: "1" under --full.
FULL = os.environ.get("STREAMBATCH_FULL_TESTS") == "1"
# tests/support/ (helpers, shards, servers, launchers: imported as tests.support.*) and the tests/ folder (test
# files live in sub-folders that mirror the package).
SUPPORT = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(SUPPORT)
ROOT = os.path.dirname(TESTS)


def examples(n: int) -> int:
    """Hypothesis examples for a property test: ``n`` in the full tier, a
    fifth (at least 10) in the fast loop. The same property is checked in
    both; the full tier only searches longer."""
    return n if FULL else max(10, n // 5)


def wait_for_files(paths: list[str], timeout: float = 600) -> None:
    """Wait until every path exists (the files a job of other processes writes whole, then renames).

    The timeout is a hang guard, not a speed limit: the writers may be a few spawned
    processes importing torch on a machine at load 10, so it sits just under the
    tests' own pytest timeouts."""
    end = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout} s for {paths}")
        time.sleep(0.05)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for gloo rendezvous, servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lognormal_lengths(n: int, seed: int = 0) -> np.ndarray:
    """(n,) int64 audio-like lengths: log-normal around 5 s, clipped to
    0.5-30 s, in frames at 50 frames/s."""
    rs = np.random.default_rng(seed)
    return np.ceil(np.clip(rs.lognormal(np.log(5), 0.8, n), 0.5, 30) * 50).astype(np.int64)


class Echo:
    """A map-style dataset whose item i is i (so batches show the indices)."""

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> int:
        return i


def check_resizes(windows, trained, history, world, lens, drop_last, max_length) -> None:
    """Replay an epoch through resizes and check every sample trained once.

    windows(w, segments) -> the epoch's windows at world size w after the
    resize history ``segments`` ((world, steps) pairs); trained(windows, lo,
    hi) -> (shard, index) of the samples trained in epoch steps [lo, hi);
    history: (world, fraction of the remaining steps) per resize; lens:
    shard -> (n,) int64 lengths. Asserts: determinism, nothing trained twice
    beyond each world's final-step padding, nothing lost but ``drop_last``'s
    drop and samples over ``max_length``.
    """
    import collections

    segments, got, ended = (), [], False
    for w, frac in history:
        ws = windows(w, segments)
        done = sum(k for _, k in segments)
        total = sum(x.num_steps for x in ws)
        k = int(frac * (total - done))
        got += trained(ws, done, done + k)
        ended = ended or done + k == total
        segments += ((w, k),)
    ws = windows(world, segments)
    done = sum(k for _, k in segments)
    got += trained(ws, done, 10**9)
    assert trained(windows(world, segments), done, 10**9) == trained(ws, done, 10**9)  # deterministic
    c = collections.Counter(got)
    wanted = {(s, i) for s, x in lens.items() for i, v in enumerate(x) if max_length is None or v <= max_length}
    assert set(c) <= wanted
    missing = len(wanted - set(c))
    last = [x for x in ws if x.last]
    if not drop_last:
        assert missing == 0
    elif not ended and last:
        assert missing == last[0].plan.num_dropped
    assert sum(c.values()) - len(c) <= sum(w - 1 for w, k in segments if k) + world - 1
