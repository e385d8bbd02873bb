"""The one log line before a cold Numba compile (``planners/compile_notice.py``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import pytest

from streambatch.planners import compile_notice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_kernels(name: str, index_paths: list[str]) -> types.ModuleType:
    """A module holding objects shaped like Numba dispatchers with ``cache=True``."""
    mod = types.ModuleType(name)
    for i, path in enumerate(index_paths):
        kernel = types.SimpleNamespace(__module__=name,
                                       _cache=types.SimpleNamespace(_cache_file=types.SimpleNamespace(_index_path=path)))
        setattr(mod, f"k{i}", kernel)
    return mod


def test_cold_means_no_kernel_of_the_module_is_cached(tmp_path, monkeypatch):
    paths = [str(tmp_path / f"kernels.k{i}-1.py311.nbi") for i in range(3)]
    monkeypatch.setitem(sys.modules, "streambatch_fake.kernels", fake_kernels("streambatch_fake.kernels", paths))
    assert compile_notice.cold_cache("streambatch_fake.kernels") == str(tmp_path)
    open(paths[1], "wb").close()  # one kernel compiled and cached: the environment is warm
    assert compile_notice.cold_cache("streambatch_fake.kernels") is None
    assert compile_notice.cold_cache("streambatch_fake.nothing_here") is None


def test_the_line_is_logged_once_per_process(tmp_path, monkeypatch, caplog):
    for pkg in ("streambatch.fake_a", "streambatch.fake_b"):
        paths = [str(tmp_path / pkg / "kernels.k0-1.py311.nbi")]
        monkeypatch.setitem(sys.modules, f"{pkg}.kernels", fake_kernels(f"{pkg}.kernels", paths))
    monkeypatch.setattr(compile_notice, "_said", False)
    monkeypatch.setattr(compile_notice, "_seen", set())
    with caplog.at_level(logging.WARNING, logger="streambatch.planners"):
        compile_notice.notice_if_cold("streambatch.fake_a.kernels")
        compile_notice.notice_if_cold("streambatch.fake_a.kernels")
        compile_notice.notice_if_cold("streambatch.fake_b.kernels")
        compile_notice.notice_if_cold("")  # a planner registered from user code declares no kernels: not looked at
        compile_notice.notice_if_cold("__main__.kernels")  # nor one outside the package
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "once per environment" in lines[0] and "fake_a" in lines[0], lines


@pytest.mark.slow  # a cold compile in a fresh interpreter
def test_a_cold_first_plan_says_so_and_a_warm_one_does_not(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = "import numpy as np; from streambatch import make_plan; make_plan(np.arange(1, 50), 500, planner='greedy')"
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    cold, warm = (r.stderr for r in runs)
    assert cold.count("compiling the planners with Numba") == 1 and "once per environment" in cold, cold
    assert str(tmp_path / "numba") in cold
    assert "compiling" not in warm, warm
