"""States saved by the code of 2026-12-02 (before the sub-package split of
issue 18) still load and resume the same batches: the state format is part
of what users see. ``tests/data/states/*.json`` each hold a state and the
batches (keys, or sample indices for the sampler) every rank yields after
loading it; the corpora are regenerated from fixed seeds.

Rewrite the files only on purpose (a deliberate format change):
``PYTHONPATH=$PWD python tests/test_saved_states.py``."""

from __future__ import annotations

import json
import os

import pytest

from streambatch import DynamicBatchSampler, PlanChangedWarning
from streambatch.streaming import Source, StreamingBatches
from tests.support.corpus import index_corpus
from tests.support.helpers import lognormal_lengths
from tests.support.shards import write_corpus

HERE = os.path.dirname(os.path.abspath(__file__))

DATA = os.path.join(HERE, "data", "states")
BUDGET, CAP = 400, 6


def corpora() -> dict[str, str]:
    """The corpora in the working directory, by relative URLs: the state's fingerprint
    covers the shard URLs, so they must read the same wherever the test runs
    (a tmp folder made the working directory)."""
    out = {}
    for name, sizes, seed in (("a", [21, 17, 0, 25, 19, 23, 14, 22], 17), ("b", [9, 14, 7, 12], 4)):
        brace, _, _ = write_corpus(name, sizes, seed=seed, prefix=name)
        index_corpus(brace)
        out[name] = brace
    return out


# name: (urls of the corpora, keywords, epoch, [(world size, batches to take) ... the saving runs], resume world)
CASES = {
    "sample_mid_epoch": (lambda c: c["a"], {"read_mode": "sample", "window_samples": 50}, 1, [(2, 4)], 2),
    "shard_mid_epoch": (lambda c: c["a"], {"read_mode": "shard", "window_samples": 50}, 0, [(3, 3)], 3),
    "shard_elastic": (lambda c: c["a"], {"read_mode": "shard", "window_samples": 50, "drop_last": True}, 2,
                      [(4, 2), (2, 2)], 2),  # the first resize inside window 0 (3 steps at W = 4)
    "sample_elastic": (lambda c: c["a"], {"read_mode": "sample", "window_samples": 40, "max_length": 45}, 1,
                       [(3, 4), (1, 3)], 2),
    "mix_mid_epoch": (lambda c: [Source(c["a"], weight=0.6), Source(c["b"], weight=0.4)],
                      {"read_mode": "sample", "window_samples": 40, "samples_per_epoch": 150}, 3, [(2, 3)], 2),
}


def run(case, srcs, world, state, steps=None):
    """Every rank of ``world``: load ``state`` (if any), take ``steps`` batches
    (default: the rest of the epoch); their keys and rank 0's state after."""
    urls, kw, epoch, _, _ = case
    out, after = [], None
    for r in range(world):
        ds = StreamingBatches(urls(srcs), BUDGET, CAP, rank=r, world_size=world, **kw)
        ds.set_epoch(epoch)
        if state is not None:
            ds.load_state_dict(state)
        got = []
        for batch in ds:
            got.append([s["__key__"] for s in batch])
            if steps is not None and len(got) == steps:
                break
        out.append(got)
        after = after or ds.state_dict()
    return out, after


def saved(case, srcs):
    state = None
    for world, steps in case[3]:
        _, state = run(case, srcs, world, state, steps)
    return state


def sampler_run(state=None):
    out = []
    for r in range(2):
        s = DynamicBatchSampler(lognormal_lengths(700), 3000, 16, world_size=2, rank=r, seed=7)
        s.set_epoch(2)
        if state is not None:
            s.load_state_dict(state)
        out.append([list(map(int, b)) for b in s])
    return out


def sampler_saved():
    s = DynamicBatchSampler(lognormal_lengths(700), 3000, 16, world_size=2, rank=0, seed=7)
    s.set_epoch(2)
    it = iter(s)
    for _ in range(5):
        next(it)
    return s.state_dict()


def load(name):
    with open(os.path.join(DATA, f"{name}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def srcs(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        srcs = corpora()
    return root, srcs


@pytest.fixture
def in_corpora(srcs, monkeypatch):
    monkeypatch.chdir(srcs[0])
    return srcs[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_saved_streaming_state_resumes_the_same_batches(in_corpora, name):
    srcs = in_corpora
    data = load(name)
    case = CASES[name]
    # saved mid-epoch before plan generations were recorded (core/state.py): loading says the epoch is replanned
    assert "plans" not in data["state"] and data["state"]["step"] > 0
    with pytest.warns(PlanChangedWarning, match=f"saved {data['state']['step']} step"):
        got, _ = run(case, srcs, case[4], data["state"])
    assert got == data["resumed"]
    assert sum(len(b) for rank in got for b in rank) > 0  # resuming trains something
    if len(case[3]) > 1:  # an elastic history, saved with its digest
        assert data["state"]["segments"] and "history" in data["state"]


def test_saved_sampler_state_resumes_the_same_batches():
    data = load("sampler_mid_epoch")
    assert data["state"]["step"] == 5
    assert sampler_run(data["state"]) == data["resumed"]


def write() -> None:
    srcs = corpora()
    os.makedirs(DATA, exist_ok=True)
    for name, case in CASES.items():
        state = saved(case, srcs)
        got, _ = run(case, srcs, case[4], state)
        with open(os.path.join(DATA, f"{name}.json"), "w") as f:
            json.dump({"state": state, "resumed": got}, f, indent=1, sort_keys=True)
    state = sampler_saved()
    with open(os.path.join(DATA, "sampler_mid_epoch.json"), "w") as f:
        json.dump({"state": state, "resumed": sampler_run(state)}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        write()
