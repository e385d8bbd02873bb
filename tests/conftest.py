"""Test tiers: ``python -m pytest`` runs the fast tier (tests not marked
``slow``, small hypothesis budgets); ``python -m pytest --full`` runs every
test with the full hypothesis budgets (what ``.ci/run`` does). An explicit
``-m`` expression wins over both."""

from __future__ import annotations

import hashlib
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
# the shared corpus fixture (make_corpus) and helpers live in tests/support/, imported as tests.support.*
pytest_plugins = ("tests.support.corpus",)
# gcsfs reads this at import: without it every gs:// bucket first waits 60 s for a gRPC probe that
# fake-gcs-server cannot answer (tests/cloud_servers.py)
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def _kernel_cache_dir(root: str) -> str:
    """A Numba cache folder keyed on the content of every kernel module.

    Numba's cache checks only the source file of the cached function, not the
    helpers it inlined from other modules: after an edit to, say,
    ``planners/bucketed/layouts.py`` the cached ``plan_steps`` of
    ``kernels.py`` would still run the old helper, and the tests would pass
    on code that is no longer there. Keyed on all kernel sources, an edit
    anywhere recompiles and an unchanged tree stays warm. Older keys are
    removed.
    """
    digest = hashlib.sha256()
    package = os.path.join(root, "streambatch")
    for folder, dirs, files in sorted(os.walk(package)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    text = f.read()
                if b"njit" in text:
                    digest.update(name.encode() + b"\0" + text)
    parent = os.path.join(root, ".pytest_cache", "numba")
    key = digest.hexdigest()[:16]
    if os.path.isdir(parent):
        for old in os.listdir(parent):
            if old != key:
                shutil.rmtree(os.path.join(parent, old), ignore_errors=True)
    return os.path.join(parent, key)


# Before anything imports numba (subprocesses the tests start inherit it); a
# NUMBA_CACHE_DIR the developer set wins.
if "NUMBA_CACHE_DIR" not in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = _kernel_cache_dir(os.path.dirname(HERE))


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="run the slow tier too (multi-process, servers, subprocesses, long hypothesis runs)")


def pytest_configure(config):
    full = config.getoption("--full")
    # Read by tests/helpers.py when test modules are imported (after this hook).
    os.environ["STREAMBATCH_FULL_TESTS"] = "1" if full else "0"
    if not config.option.markexpr:
        config.option.markexpr = "" if full else "not slow"
