"""Test tiers: ``python -m pytest`` runs the fast tier (tests not marked
``slow``, small hypothesis budgets); ``python -m pytest --full`` runs every
test with the full hypothesis budgets (what ``.ci/run`` does). An explicit
``-m`` expression wins over both."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # helpers, shards, roundtrip


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="run the slow tier too (multi-process, servers, subprocesses, long hypothesis runs)")


def pytest_configure(config):
    full = config.getoption("--full")
    # Read by tests/helpers.py when test modules are imported (after this hook).
    os.environ["STREAMBATCH_FULL_TESTS"] = "1" if full else "0"
    if not config.option.markexpr:
        config.option.markexpr = "" if full else "not slow"
