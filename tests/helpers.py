"""Helpers shared by the tests: free ports, length generators, a dataset stub,
and the hypothesis example budget of the current tier."""

from __future__ import annotations

import os
import socket

import numpy as np

# Set by conftest.py before any test module is imported: "1" under --full.
FULL = os.environ.get("STREAMBATCH_FULL_TESTS") == "1"


def examples(n: int) -> int:
    """Hypothesis examples for a property test: ``n`` in the full tier, a
    fifth (at least 10) in the fast loop. The same property is checked in
    both; the full tier only searches longer."""
    return n if FULL else max(10, n // 5)


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
