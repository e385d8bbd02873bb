"""A state is checked before any planning work (issue 17, item 7): every
counter bounded, the elastic history (``segments``) bounded and bound to the
fingerprint by the ``history`` digest, for the sampler and the streaming
dataset alike; real elastic resumes (and states saved before the digest
existed) still load.

"No planning work" is checked by a counter around the real planners: every
sample-mode plan goes through a registered planner (``PLANNERS``), so each
is wrapped, and a call inside a guarded ``load_state_dict`` fails the test
at once (before an old loader could allocate gigabytes planning at
world_size=10**9).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses

import pytest

from streambatch import DynamicBatchSampler
from streambatch.planners import PLANNERS
from streambatch.streaming import StreamingBatches
from tests.support.helpers import lognormal_lengths

LENGTHS = lognormal_lengths(400, seed=21)
BUDGET, CAP, WINDOW = 400, 4, 90  # streaming: a few samples a batch, so each world takes several steps


class Planned(RuntimeError):
    """A planner ran inside a block that must not plan."""


@contextlib.contextmanager
def no_planning(monkeypatch):
    """Inside the block, every registered planner counts its calls and raises
    ``Planned``; yields the list of calls (world sizes)."""
    calls: list[int] = []
    for name, p in list(PLANNERS.items()):
        def counted(lengths, tokens, cap, world, *args, **kw):
            calls.append(world)
            raise Planned(f"planned {lengths.shape[0]} samples at world_size={world} while checking a state")
        monkeypatch.setitem(PLANNERS, name, dataclasses.replace(p, plan=counted))
    try:
        yield calls
    finally:
        monkeypatch.undo()


@contextlib.contextmanager
def counting(monkeypatch):
    """Every registered planner counts its calls (and plans for real)."""
    calls: list[int] = []
    for name, p in list(PLANNERS.items()):
        def counted(lengths, tokens, cap, world, *args, _real=p.plan, **kw):
            calls.append(world)
            return _real(lengths, tokens, cap, world, *args, **kw)
        monkeypatch.setitem(PLANNERS, name, dataclasses.replace(p, plan=counted))
    try:
        yield calls
    finally:
        monkeypatch.undo()


# ---------------------------------------------------------------- the two loaders


def sampler(world: int = 2, rank: int = 0, lengths=LENGTHS, **kw) -> DynamicBatchSampler:
    return DynamicBatchSampler(lengths, 4000, 16, rank=rank, world_size=world, seed=3, **kw)


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus([37, 23, 41, 29, 35, 18], seed=3, name="bounds")
    return c.brace, c.expected


def stream(corpus, world: int = 2, rank: int = 0, **kw) -> StreamingBatches:
    kw.setdefault("window_samples", WINDOW)
    return StreamingBatches(corpus[0], BUDGET, CAP, rank=rank, world_size=world, seed=3, **kw)


def elastic_state(make, world0: int = 4, world1: int = 3, steps: int = 5) -> dict:
    """A real state with an elastic history: saved at ``world0`` after
    ``steps`` steps of epoch 1, loaded at ``world1`` and saved again."""
    first = make(world0)
    first.set_epoch(1)
    it = iter(first)
    for _ in range(steps):
        next(it)
    state = first.state_dict()
    second = make(world1)
    second.load_state_dict(state)
    out = second.state_dict()
    assert out["segments"] == [[world0, steps]] and out["step"] == steps
    return out


LOADERS = ["sampler", "streaming"]
DELETE = object()  # a key removed from a state


def loader(kind: str, corpus):
    """make(world) -> a fresh rank-0 sampler or streaming dataset."""
    return (lambda w: sampler(w)) if kind == "sampler" else (lambda w: stream(corpus, w))


# ---------------------------------------------------------------- tampered states refused before planning


# Each history claims as many steps as the state's step, so that only planning could tell it is wrong.
TAMPERED = [
    ("world 10**9", {"segments": [[10**9, 1]], "step": 1}, r"world_size 1000000000 is outside \[1, 65536\]"),
    ("world 10**7", {"segments": [[10**7, 1]], "step": 1}, r"world_size 10000000 is outside \[1, 65536\]"),
    ("steps 10**12", {"segments": [[2, 10**12]], "step": 10**12},
     r"segment 0 claims 1000000000000 steps.*outside \[1, \d+\]"),
    ("steps summed", {"segments": [[2, 150], [3, 150], [2, 150]], "step": 450},
     r"segments 0\.\.\d claim \d+ steps.*outside \[1, \d+\]"),
    ("10**6 segments", {"segments": [[2, 1]] * 10**6, "step": 10**6}, r"holds 1000000 segments, outside \[0, 64\]"),
    ("zero steps", {"segments": [[2, 0]] * 50, "step": 1}, r"steps >= 1"),
    ("negative world", {"segments": [[-2, 1]], "step": 1}, r"world_size >= 1"),
    ("bool world", {"segments": [[True, 1]], "step": 1}, r"pair of ints"),
    ("float steps", {"segments": [[2, 1.0]], "step": 1}, r"pair of ints"),
    ("not pairs", {"segments": [[2, 1, 1]], "step": 1}, r"pair of ints"),
    ("step 2**70", {"step": 2**70}, r"state\['step'\] = 1180591620717411303424 is outside \[0, \d+\]"),
    ("step 2**70 at epoch 5", {"step": 2**70, "epoch": 5}, r"state\['step'\] = 1180591620717411303424 is outside"),
    ("step -1", {"step": -1}, r"state\['step'\] = -1 is outside"),
    ("step bool", {"step": True}, r"state\['step'\] must be an integer, got True"),
    ("step float", {"step": 1.5}, r"state\['step'\] must be an integer, got 1.5"),
    ("world_size 2**70", {"world_size": 2**70}, r"state\['world_size'\] = 1180591620717411303424 is outside"),
    ("world_size 0", {"world_size": 0}, r"state\['world_size'\] = 0 is outside \[1, 65536\]"),
    ("world_size float", {"world_size": 2.0}, r"state\['world_size'\] must be an integer"),
    ("epoch -1", {"epoch": -1}, r"state\['epoch'\] = -1 is outside \[0, 4294967295\]"),
]


@pytest.mark.parametrize("kind", LOADERS)
@pytest.mark.parametrize("what, change, message", TAMPERED, ids=[t[0] for t in TAMPERED])
def test_tampered_state_is_refused_without_planning(kind, what, change, message, corpus, monkeypatch):
    make = loader(kind, corpus)
    target = make(3)
    good = target.state_dict()  # its own state (epoch 0, world 3), then edited
    bad = {**good, **change}
    before = target.state_dict()
    with no_planning(monkeypatch) as calls, pytest.raises(ValueError, match=message) as err:
        target.load_state_dict(bad)
    assert calls == []
    if "must be an integer" not in message:
        assert "damaged or edited" in str(err.value)  # the likely cause is named
    assert target.state_dict() == before  # a refused state changes nothing


STREAMING_ONLY = [
    ("skipped 2**70", {"skipped": 2**70}, r"state\['skipped'\] = 1180591620717411303424 is outside \[0, 9007199254"),
    ("skipped -1", {"skipped": -1}, r"state\['skipped'\] = -1 is outside"),
    ("skipped bool", {"skipped": True}, r"state\['skipped'\] must be an integer, got True"),
    ("skipped float", {"skipped": 2.5}, r"state\['skipped'\] must be an integer, got 2.5"),
    ("num_workers 10**6", {"worker": 0, "num_workers": 10**6},
     r"state\['num_workers'\] = 1000000 is outside \[1, 256\]"),
    ("worker beyond", {"worker": 5, "num_workers": 2}, r"state\['worker'\] = 5 is outside \[0, 1\]"),
    ("worker float", {"worker": 0.5, "num_workers": 2}, r"state\['worker'\] must be an integer"),
    ("main num_workers", {"num_workers": -3}, r"state\['num_workers'\] = -3 is outside"),
]


@pytest.mark.parametrize("what, change, message", STREAMING_ONLY, ids=[t[0] for t in STREAMING_ONLY])
def test_tampered_streaming_counters_are_refused(what, change, message, corpus, monkeypatch):
    ds = stream(corpus, 3)
    good = ds.state_dict()
    with no_planning(monkeypatch) as calls, pytest.raises(ValueError, match=message):
        ds.load_state_dict({**good, **change})
    assert calls == [] and ds.num_skipped == 0


# ---------------------------------------------------------------- the history digest


@pytest.mark.parametrize("kind", LOADERS)
def test_edited_history_is_refused_by_its_digest(kind, corpus, monkeypatch):
    make = loader(kind, corpus)
    state = elastic_state(make)
    assert isinstance(state["history"], int) and 0 <= state["history"] < 2**63
    target = make(5)
    edits = {
        "more steps": {"segments": [[4, 6]], "step": 6},
        "fewer steps": {"segments": [[4, 4]]},
        "other world": {"segments": [[2, 5]]},
        "extra segment": {"segments": [[4, 5], [2, 1]], "step": 6},
        "segments removed": {"segments": DELETE},
        "other epoch": {"epoch": 2},
    }
    for what, change in edits.items():
        bad = {k: v for k, v in {**state, **change}.items() if v is not DELETE}
        with no_planning(monkeypatch) as calls, pytest.raises(ValueError, match=r"does not match state\['history'\]"):
            target.load_state_dict(bad)
        assert calls == [], what
    for digest in ("0x1", 2**63, -1, 1.5):
        with no_planning(monkeypatch), pytest.raises(ValueError, match=r"state\['history'\]"):
            target.load_state_dict({**state, "history": digest})
    with counting(monkeypatch) as calls:
        target.load_state_dict(state)  # the state as saved: planned, and accepted
    assert calls


@pytest.mark.parametrize("kind", LOADERS)
def test_state_saved_before_the_digest_still_loads(kind, corpus):
    """States saved by streambatch before ``history`` existed have segments
    and no digest: they load as before (the bounds alone check them)."""
    make = loader(kind, corpus)
    state = elastic_state(make)
    old = {k: v for k, v in state.items() if k != "history"}
    a, b = make(5), make(5)
    a.load_state_dict(state)
    b.load_state_dict(old)
    assert len(a) == len(b) and a.state_dict() == b.state_dict()
    if kind == "sampler":
        assert list(a) == list(b)
    else:
        assert [[s["__key__"] for s in x] for x in a] == [[s["__key__"] for s in x] for x in b]


@pytest.mark.parametrize("kind", LOADERS)
def test_more_resizes_than_a_state_records_are_refused_before_planning(kind, corpus, monkeypatch):
    make = loader(kind, corpus)
    target = make(3)
    full = {**target.state_dict(), "epoch": 1, "world_size": 2, "segments": [[2, 1]] * 64, "step": 65}
    full["fingerprint"] = make(2).state_dict()["fingerprint"]  # saved at world 2 (a state from before the digest)
    with no_planning(monkeypatch) as calls, pytest.raises(ValueError, match="at most 64 times"):
        target.load_state_dict(full)
    assert calls == []


# ---------------------------------------------------------------- real resumes still work


def sampler_world(world: int, state: dict | None, steps: int | None = None):
    """Every rank of a sampler world over epoch 1 (resumed from ``state``):
    their batches and rank 0's state after ``steps`` steps (None: all)."""
    ranks = [sampler(world, r) for r in range(world)]
    out = []
    for s in ranks:
        s.set_epoch(1)
        if state is not None:
            s.load_state_dict(state)
        it = iter(s)
        out.append([b for _, b in zip(range(steps if steps is not None else 10**9), it)])
    states = [s.state_dict() for s in ranks]
    assert all(x == states[0] for x in states)  # rank-independent, the digest too
    return out, states[0]


def stream_world(corpus, world: int, state: dict | None, steps: int | None = None):
    ranks = [stream(corpus, world, r) for r in range(world)]
    out = []
    for ds in ranks:
        ds.set_epoch(1)
        if state is not None:
            ds.load_state_dict(state)
        it = iter(ds)
        out.append([[s["__key__"] for s in b] for _, b in zip(range(steps if steps is not None else 10**9), it)])
    states = [ds.state_dict() for ds in ranks]
    assert all(x == states[0] for x in states)
    return out, states[0]


@pytest.mark.parametrize("kind", LOADERS)
def test_elastic_resume_4_3_5_still_works(kind, corpus):
    """Save at W=4 mid-epoch, resume at W=3, save again, resume at W=5: every
    sample of the epoch once (but the final steps' padding), states carry
    the digest and every rank's state is the same."""
    run = sampler_world if kind == "sampler" else (lambda *a, **k: stream_world(corpus, *a, **k))
    head, s1 = run(4, None, steps=6)
    mid, s2 = run(3, s1, steps=4)
    tail, end = run(5, s2)
    assert "history" not in s1 and s2["segments"] == [[4, 6]] and "history" in s2
    assert end["segments"] == [[4, 6], [3, 4]] and end["history"] != s2["history"]
    assert len({len(t) for t in tail}) == 1  # equal steps on every rank of the new world
    got = collections.Counter(x for part in (head, mid, tail) for rank in part for b in rank for x in b)
    universe = range(LENGTHS.shape[0]) if kind == "sampler" else corpus[1]
    assert set(got) == set(universe)
    assert sum(got.values()) - len(got) <= 3 + 2 + 4  # at most the padding of each world's final step
    again, _ = run(5, s2)
    assert again == tail  # deterministic


def test_a_world_larger_than_the_epoch_is_not_refused():
    """3 samples at W=8: one padded step. Resumed at W=4 the history is
    [[8, 1]], a world above the epoch's samples that the library itself
    saves: it loads (the cap is max(N, this world, 2**16))."""
    tiny = [100, 200, 300]
    s8 = sampler(8, lengths=tiny)
    s8.set_epoch(1)
    assert len(list(s8)) == 1
    s4 = sampler(4, lengths=tiny)
    s4.load_state_dict(s8.state_dict())
    state = s4.state_dict()
    assert state["segments"] == [[8, 1]] and list(s4) == []
    s2 = sampler(2, lengths=tiny)
    s2.load_state_dict(state)
    assert len(s2) == 1 and list(s2) == []


def test_a_loader_state_with_tampered_worker_counters_is_refused(corpus, monkeypatch):
    """A StatefulDataLoader's state (two real workers): each worker's counters
    are checked as ints, their sum bounded, before any planning."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = stream(corpus, 2)
    ds.set_epoch(1)
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    del it
    workers = state["_snapshot"]["_worker_snapshots"]
    assert set(workers) == {"worker_0", "worker_1"}

    def with_worker_1(**change):
        out = {**state, "_snapshot": {**state["_snapshot"], "_worker_snapshots": dict(workers)}}
        w1 = workers["worker_1"]
        out["_snapshot"]["_worker_snapshots"]["worker_1"] = {**w1, "dataset_state": {**w1["dataset_state"], **change}}
        return out

    target = stream(corpus, 2)
    for change, message in [({"skipped": 2**70}, r"state\['skipped'\] = 1180591620717411303424 is outside"),
                            ({"skipped": 2.5}, r"state\['skipped'\] must be an integer, got 2.5"),
                            ({"step": 3.0}, r"state\['step'\] must be an integer, got 3.0")]:
        with no_planning(monkeypatch) as calls, pytest.raises(ValueError, match=message):
            target.load_state_dict(with_worker_1(**change))
        assert calls == [] and target.num_skipped == 0
    target.load_state_dict(state)  # untouched, it loads: the pass resumes after the 3 batches the loader yielded
    ref = stream_world(corpus, 2, None)[0][0]  # rank 0's batches of epoch 1, uninterrupted
    assert [[s["__key__"] for s in b] for b in target] == ref[3:]
