"""``streambatch index`` never waits on a job that is not there (issue 32, item 19).

A process that merely inherits ``RANK``/``WORLD_SIZE`` (a subprocess started by rank 0 of a torchrun job, a
shell inside one) indexes every shard itself and says why; the work is split over ranks only for a process
torchrun started itself, or when asked (``--part I/N``, ``--distributed``), and then the ranks must meet within
``--join-timeout`` seconds or every process fails naming the fix. The ranks of a real two-process job
(rendezvous on 127.0.0.1) split the shards and rank 0 writes the whole catalog; a real torchrun job whose rank 0
runs ``streambatch index`` in a subprocess gets every shard indexed, at once. (``streambatch index`` run by
torchrun itself, split and merged: ``tests/streaming/io/test_remote.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streambatch.cli.main import main
from streambatch.streaming import open_catalog
from tests.support.helpers import free_port
from tests.support.shards import FPS, write_corpus

SIZES = [6, 5, 7, 4]


@pytest.fixture
def shards(tmp_path):
    _, paths, _ = write_corpus(tmp_path / "s", SIZES, seed=6)
    return tmp_path, paths, str(tmp_path / "s" / "train-{000000..000003}.tar")


def launcher_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "inherited"}


# before the fix: 1/2 of the shards, then a wait for rank 0 (torch's 30 minutes)
@pytest.mark.timeout(120, method="thread")
def test_an_inherited_rank_indexes_everything_and_says_so(shards, monkeypatch, capsys):
    tmp_path, paths, pattern = shards
    for k, v in launcher_env(1, 2, free_port()).items():  # nothing listens on MASTER_PORT
        monkeypatch.setenv(k, v)
    catalog = str(tmp_path / "s" / "all.catalog.npz")
    t0 = time.monotonic()
    assert main(["index", pattern, "--fps", str(FPS), "--no-progress", "--catalog", catalog]) == 0
    out = capsys.readouterr()
    assert time.monotonic() - t0 < 60
    assert out.out.startswith("4 shards: 4 indexed")
    assert "RANK=1, WORLD_SIZE=2" in out.err and "--distributed" in out.err
    assert open_catalog(catalog).num_samples == sum(SIZES)
    assert all(os.path.exists(p + ".idx.npz") for p in paths)


def test_distributed_needs_a_launcher(shards, monkeypatch, capsys):
    _, _, pattern = shards
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert main(["index", pattern, "--fps", str(FPS), "--no-progress", "--distributed"]) == 2
    err = capsys.readouterr().err
    assert "--distributed" in err and "RANK" in err and "torchrun" in err


def cli(argv: list[str], env: dict[str, str], cwd) -> subprocess.Popen:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full = {**os.environ, **env, "PYTHONPATH": root}
    return subprocess.Popen([sys.executable, "-m", "streambatch.cli", *argv], env=full, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # fresh interpreters importing torch
@pytest.mark.timeout(300)
def test_distributed_fails_within_the_join_timeout_when_a_rank_never_comes(shards):
    tmp_path, paths, pattern = shards
    t0 = time.monotonic()
    proc = cli(["index", pattern, "--fps", str(FPS), "--no-progress", "--distributed", "--join-timeout", "5"],
               launcher_env(0, 2, free_port()), tmp_path)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err
    assert time.monotonic() - t0 < 120
    assert "1 of 2" in err or "within 5 s" in err, err
    assert "--join-timeout" in err and err.count("streambatch: error:") == 1
    assert not any(os.path.exists(p + ".idx.npz") for p in paths)  # nothing indexed before the ranks met


@pytest.mark.slow  # two fresh interpreters importing torch, gloo on 127.0.0.1
@pytest.mark.timeout(300)
def test_two_ranks_split_the_shards_and_rank_0_writes_the_catalog(shards):
    tmp_path, paths, pattern = shards
    port = free_port()
    catalog = str(tmp_path / "s" / "job.catalog.npz")
    procs = [cli(["index", pattern, "--fps", str(FPS), "--no-progress", "--distributed", "--catalog", catalog],
                 launcher_env(r, 2, port), tmp_path) for r in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert "2 shards (part 0 of 2)" in outs[0][0] and "2 shards (part 1 of 2)" in outs[1][0]
    cat = open_catalog(catalog)
    assert list(cat.urls) == paths and cat.num_samples == sum(SIZES)


CHILD_OF_RANK_0 = """
import os, subprocess, sys
import torch.distributed as dist
dist.init_process_group("gloo")  # the job's process group is up: its store answers on MASTER_PORT
if dist.get_rank() == 0:  # rank 0 indexes in a subprocess, which inherits RANK=0, WORLD_SIZE=2, MASTER_PORT...
    out = subprocess.run([sys.executable, "-m", "streambatch.cli", "index", sys.argv[1], "--fps", sys.argv[2],
                          "--no-progress", "--catalog", sys.argv[3]], capture_output=True, text=True, timeout=120)
    with open(sys.argv[4], "w") as f:
        f.write(f"{out.returncode}\\n{out.stdout}\\n{out.stderr}")
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow  # a real torchrun job of two processes, and a third started by its rank 0
@pytest.mark.timeout(400)
def test_a_subprocess_of_rank_0_indexes_everything_at_once(shards):
    tmp_path, paths, pattern = shards
    script = tmp_path / "job.py"
    script.write_text(CHILD_OF_RANK_0)
    catalog, report = str(tmp_path / "s" / "child.catalog.npz"), str(tmp_path / "child.txt")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                          "127.0.0.1", "--master-port", str(free_port()), str(script), pattern, str(FPS), catalog,
                          report], env=env, capture_output=True, text=True, timeout=360)
    assert job.returncode == 0, job.stderr[-3000:]
    code, out = Path(report).read_text().split("\n", 1)
    assert code == "0", out
    assert out.startswith("4 shards: 4 indexed") and "RANK=0, WORLD_SIZE=2" in out
    assert open_catalog(catalog).num_samples == sum(SIZES)
