"""Every script in ``examples/`` runs end to end, as its docstring says to run it.

Each is started the way a user starts it (``python examples/X.py`` or ``torchrun
--standalone``, in a scratch directory), on the data it generates itself, and its
output is checked for what it claims: equal steps on every rank, every sample
once, a resume that continues where the stopped run left off.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from importlib.util import find_spec

import pytest

from tests.support.helpers import TESTS

EXAMPLES = os.path.join(os.path.dirname(TESTS), "examples")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def needs(*modules: str):
    missing = [m for m in modules if find_spec(m) is None]
    why = f"needs {', '.join(missing)} (pip install -e '.[dev,integrations]')"
    return pytest.mark.skipif(bool(missing), reason=why)


def run(cwd, script: str, *args: str, procs: int | None = None, timeout: float = 300) -> str:
    """Run an example as a user would; returns its stdout and stderr together."""
    cmd = [sys.executable, os.path.join(EXAMPLES, script), *args]
    if procs is not None:  # torchrun --standalone: a free rendezvous port of its own
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}", *cmd[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONFAULTHANDLER"] = "1"  # on a hang, SIGABRT makes every process print its threads' stacks
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # A hang (a run takes seconds): show where each process of the job waits, then fail with it.
        tree = descendants(proc.pid)
        for pid in tree:
            _signal(pid, signal.SIGABRT)
        time.sleep(3)
        for pid in [proc.pid, *tree]:
            _signal(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{script} {' '.join(args)} did not end within {timeout:g} s; the stacks of its processes "
                    f"(faulthandler):\n{(stdout + stderr)[-12000:]}")
    out = stdout + stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def descendants(pid: int) -> list[int]:
    """The pids of every process below ``pid`` (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(entry) as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(entry.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):  # gone already
        os.kill(pid, sig)


def epochs_per_rank(out: str) -> dict[int, dict[int, int]]:
    """{rank: {epoch: steps}} from lines like 'rank 1: epoch 0: 31 of 31 steps ...'."""
    found: dict[int, dict[int, int]] = collections.defaultdict(dict)
    for r, e, steps in re.findall(r"rank (\d+)(?: of \d+)?: epoch (\d+): (\d+)", out):
        found[int(r)][int(e)] = int(steps)
    return dict(found)


def test_map_style_ddp_trains_and_resumes(tmp_path):
    out = run(tmp_path, "map_style_ddp.py", procs=2)
    steps = epochs_per_rank(out)
    assert set(steps) == {0, 1} and steps[0] == steps[1] and set(steps[0]) == {0, 1}, out
    clips = [int(n) for n in re.findall(r"epoch 0: \d+ of \d+ steps, (\d+) clips", out)]
    assert sum(clips) >= 3000 and sum(clips) - 3000 < 2, out  # every clip once, at most W - 1 padded
    out = run(tmp_path, "map_style_ddp.py", "--checkpoint", "ckpt.pt", "--stop-after", "5", procs=2)
    assert out.count("stopped at epoch 0, step 5") == 2 and (tmp_path / "ckpt.pt").exists()
    out = run(tmp_path, "map_style_ddp.py", "--checkpoint", "ckpt.pt", procs=2)
    assert out.count("resuming at epoch 0, step 5") == 2
    assert epochs_per_rank(out) == steps  # the same epochs, finished


def test_streaming_local_streams_and_resumes_exactly(tmp_path):
    out = run(tmp_path, "streaming_local.py", "--dir", "shards")
    assert "indexed 8 shards, 320 utterances" in out
    assert set(epochs_per_rank(out)[0]) == {0, 1}
    assert "the same batches as an uninterrupted epoch" in out  # the example asserts it too
    out = run(tmp_path, "streaming_local.py", "--dir", "shards", "--workers", "1", procs=2)
    steps = epochs_per_rank(out)
    assert set(steps) == {0, 1} and steps[0] == steps[1]


@needs("s3fs", "moto", "boto3")
def test_streaming_s3_against_a_moto_server(tmp_path, monkeypatch):
    from tests.support.servers import S3_KEY, S3_SECRET, s3_server

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    with s3_server() as s3:  # the tests' moto server, as a user's MinIO would be
        out = run(tmp_path, "streaming_s3.py", "--endpoint-url", s3.endpoint, "--bucket", "examples")
        assert "indexed 8 shards in S3, 320 utterances" in out
        assert sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket="examples")["Contents"])[-1] == \
            "train/train-000007.tar.idx.npz"
    for epoch in (0, 1):
        assert f"epoch {epoch}: " in out and "320 utterances, 320 distinct (read mode shard)" in out
    out = run(tmp_path, "streaming_s3.py")  # with no endpoint it starts moto's server itself
    assert out.count("320 utterances, 320 distinct (read mode shard)") == 2


@needs("accelerate", "torchdata")
def test_accelerate_map_style_resume_and_streaming(tmp_path):
    out = run(tmp_path, "accelerate_train.py", "--state", "state", "--stop-after", "5", procs=2)
    assert "saved the state at epoch 0, step 5" in out
    out = run(tmp_path, "accelerate_train.py", "--state", "state", procs=2)
    assert "resuming at epoch 0, step 5" in out
    assert re.search(r"epoch 0: (\d+) steps per process \(len\(loader\) = \1\)", out), out
    assert re.search(r"epoch 1: (\d+) steps per process \(len\(loader\) = \1\)", out), out
    out = run(tmp_path, "accelerate_train.py", "--streaming", procs=2)
    assert "epoch 1: " in out and "steps per process" in out


@needs("transformers", "accelerate")
def test_hf_trainer_trains_and_resumes(tmp_path):
    out = run(tmp_path, "hf_trainer.py", "--out", "run", "--max-steps", "12", procs=2)
    assert "trained 12 optimizer steps" in out
    out = run(tmp_path, "hf_trainer.py", "--out", "run", "--resume", procs=2)
    found = re.search(r"trained (\d+) optimizer steps of (\d+) batches per epoch, resumed from run/checkpoint-12", out)
    assert found and int(found[1]) == 2 * int(found[2]), out  # two Trainer epochs of planned epoch 0's length


@needs("lightning")
@pytest.mark.parametrize("streaming", [False, True], ids=["map-style", "streaming"])
def test_lightning_ddp(tmp_path, streaming):
    out = run(tmp_path, "lightning_train.py", *(["--streaming", "--dir", str(tmp_path / "shards")] * streaming))
    steps = epochs_per_rank(out)
    assert set(steps) == {0, 1} and steps[0] == steps[1] and set(steps[0]) == {0, 1}, out
    assert "`max_epochs=2` reached" in out


def test_mixing_shares(tmp_path):
    out = run(tmp_path, "mixing.py")
    shares = re.findall(r"shares \{'en': ([\d.]+), 'zh': ([\d.]+), 'inhouse': ([\d.]+)\}", out)
    assert shares == [("0.6", "0.3", "0.1")] * 2, out
    assert out.count("{'en': 100, 'zh': 100}") + out.count("{'zh': 100, 'en': 100}") == 2, out


@needs("torchdata")
@pytest.mark.parametrize("streaming", [False, True], ids=["sampler", "streaming"])
def test_elastic_resume_three_to_two_ranks_trains_every_sample_once(tmp_path, streaming):
    extra = ["--streaming", "--dir", "shards"] if streaming else []
    out = run(tmp_path, "elastic_resume.py", "--checkpoint", "ckpt.pt", "--stop-after", "3", "--record", "rec",
              *extra, procs=3)
    assert out.count("stopped after 3 steps of epoch 0") == 3
    out = run(tmp_path, "elastic_resume.py", "--checkpoint", "ckpt.pt", "--record", "rec", *extra, procs=2)
    assert out.count("resuming epoch 0 after 3 steps at world size 3") == 2
    trained: collections.Counter = collections.Counter()
    for path in glob.glob(str(tmp_path / "rec" / "*.json")):
        with open(path) as f:
            trained.update(json.load(f))
    n = 320 if streaming else 2000
    assert len(trained) == n  # every sample trained ...
    assert sum(trained.values()) - n <= (3 - 1) + (2 - 1)  # ... once, but for each world's final-step padding


def test_packed_batches_map_style_and_streaming(tmp_path):
    out = run(tmp_path, "packed.py", "--dir", "shards")
    assert "SDPA with a block-diagonal mask: equal to per-clip attention" in out
    assert "none of them padding" in out and "streaming: " in out and "320 clips" in out
    out = run(tmp_path, "packed.py", "--dir", "shards2", procs=2)
    maps = sorted(line.split("map-style: ")[1] for line in out.splitlines() if "map-style: " in line)
    assert len(maps) == 2 and maps[0].split(" packed")[0] == maps[1].split(" packed")[0]  # equal steps per rank
