"""The cross-rank failure channel (streaming/runtime/failures.py), without a process
group: two simulated ranks' datasets share a TCPStore started in this process;
rank 1 cannot decode the samples of a shard that it alone reads (shard mode)."""

from __future__ import annotations

import os
import pickle
import threading

import pytest
from torch.distributed import TCPStore
from torch.utils.data import DataLoader

from streambatch.streaming import ShardError, StreamingBatches
from streambatch.streaming.runtime.failures import FailureChannel, open_channel

SIZES = [37, 23, 41, 29, 35, 18, 44, 31]
BUDGET, CAP = 400, 12


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=3, name="failures")
    return c.brace


@pytest.fixture
def store():
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield master


class FailOn:
    """decode: raise for every sample of one shard."""

    def __init__(self, name: str | None) -> None:
        self.name = name

    def __call__(self, sample: dict) -> dict:
        if os.path.basename(sample["__url__"]) == self.name:
            raise RuntimeError("bad audio")
        return sample


def make(corpus, rank, bad=None, store=None, namespace="t", wait=30.0):
    ds = StreamingBatches(corpus, BUDGET, CAP, window_samples=60, read_mode="shard", rank=rank, world_size=2,
                          decode=FailOn(bad))
    if store is not None:
        ds._failures = FailureChannel("127.0.0.1", store.port, namespace, rank, 2, wait=wait)
    return ds


def only_rank1_shard(corpus):
    """A shard that only rank 1 reads, first met after rank 1's first batch."""
    urls = [[[os.path.basename(s["__url__"]) for s in b] for b in make(corpus, r)] for r in range(2)]
    theirs = {u for b in urls[0] for u in b}
    for b in urls[1][1:]:
        for u in b:
            if u not in theirs and u not in urls[1][0]:
                return u
    pytest.skip("no shard read by rank 1 alone")


def test_no_process_group_no_channel(corpus):
    assert open_channel(1, 0, 2) is None and make(corpus, 0)._failures is None


def test_healthy_rank_stops_within_a_batch_of_the_failure(corpus, store):
    bad = only_rank1_shard(corpus)
    healthy, broken = iter(make(corpus, 0, store=store)), iter(make(corpus, 1, bad, store))
    steps = 0
    with pytest.raises(ShardError, match=rf"decod.*{bad}.*byte"):
        while True:
            next(broken)
            next(healthy)
            steps += 1
    assert steps >= 1  # the failure was mid-epoch
    with pytest.raises(ShardError, match=rf"^rank 1 failed reading its shards in epoch 0: .*{bad}.*byte"):
        next(healthy)


# slow tier: forked DataLoader workers and a polling wait (~3 s)
@pytest.mark.slow
def test_rank_that_finished_early_hears_of_a_late_failure(corpus, store):
    bad = only_rank1_shard(corpus)
    errors: list[str] = []

    def run_healthy():
        try:  # two forked workers; the epoch ends before rank 1 starts
            for _ in DataLoader(make(corpus, 0, store=store), batch_size=None, num_workers=2,
                                multiprocessing_context="fork"):
                pass
            errors.append("")
        except Exception as exc:
            errors.append(str(exc))

    t = threading.Thread(target=run_healthy)
    t.start()
    t.join(3.0)
    assert t.is_alive()  # waiting for rank 1's passes
    with pytest.raises(ShardError, match=bad):
        list(make(corpus, 1, bad, store))
    t.join(30)
    assert bad in errors[0] and "rank 1 failed" in errors[0], errors


def test_clean_epochs_end_and_keys_are_per_epoch(corpus, store):
    a, b = make(corpus, 0, store=store), make(corpus, 1, store=store)
    b._failures.report(1, ShardError("shard x.tar at byte 7"))  # epoch 1 failed; epoch 0 is not poisoned
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(len(list(a))))
    t.start()
    n = len(list(b))
    t.join(30)
    assert done == [n] == [len(a)]
    a.set_epoch(1)
    with pytest.raises(ShardError, match="rank 1 failed.*x.tar at byte 7"):
        next(iter(a))
    assert pickle.loads(pickle.dumps(a._failures))._store is None  # no socket travels to a worker


def _forked_check(port, out):
    import time

    time.sleep(1.0)  # the parent has dropped its store server by now; this process still holds its socket
    channel = FailureChannel("127.0.0.1", port, "t", 1, 2, connect_timeout=2.0)
    start = time.monotonic()
    channel.check(0)  # no failure heard, no hang: the store is gone
    out.put((channel._off, time.monotonic() - start))


@pytest.mark.slow  # a forked process and a 2 s connect bound
def test_a_forked_worker_does_not_hang_on_a_store_that_is_gone():
    # Rank 0's forked DataLoader workers inherit its store server's listening socket; after rank 0's group
    # is destroyed a connection to it is accepted by the kernel and never answered (TCPStore's own timeout
    # did not end it: > 40 s measured). The channel gives up after connect_timeout and stops listening.
    import multiprocessing as mp

    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_forked_check, args=(master.port, out))
    p.start()
    del master
    p.join(60)
    hung = p.is_alive()
    if hung:
        p.kill()
    assert not hung, "the forked process hung connecting to a store that is gone"
    off, seconds = out.get(timeout=5)
    assert off and seconds < 10
