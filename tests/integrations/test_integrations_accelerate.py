"""accelerate: the per-rank sampler passed through prepare raises instead of
silently losing half the data; GlobalBatchSampler gives each process the
plain DDP loop's batches; resume through skip_first_batches and through
save_state/load_state; StreamingBatches iterated beside accelerate."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("accelerate")

import torch.multiprocessing as mp
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from torch.utils.data import DataLoader

from streambatch import DynamicBatchSampler, StreamingBatches
from streambatch.integrations import FixedLengthEpochs, GlobalBatchSampler
from tests.support.corpus import index_corpus
from tests.support.helpers import Echo, free_port
from tests.support.shards import write_corpus
from tests.support.trainer_runs import (
    BUDGET,
    CAP,
    WORLD,
    check_epoch,
    lengths,
    plain_ddp,
    rank_env,
    read_ranks,
    write_json,
)


def sampler(rank=0, planner="greedy", **kw):
    return DynamicBatchSampler(lengths(), BUDGET, CAP, rank=rank, world_size=WORLD, planner=planner, **kw)


def prepared(batch_sampler, rank, **kw):
    """What accelerator.prepare does to the loader on process ``rank`` of 2."""
    loader = DataLoader(Echo(), batch_sampler=batch_sampler, collate_fn=list)
    return prepare_data_loader(loader, num_processes=WORLD, process_index=rank, **kw)


# ---------------------------------------------------------------- one process, accelerate's own dealing


def test_per_rank_sampler_through_prepare_raises_instead_of_losing_half():
    for rank in range(WORLD):
        loader = prepared(sampler(rank), rank)
        assert len(loader) < len(sampler(rank))  # accelerate would deal out the rank's batches again
        with pytest.raises(ValueError, match="GlobalBatchSampler"):
            next(iter(loader))


@pytest.mark.parametrize("planner", ["greedy", "bucketed"])
def test_global_view_deals_each_process_its_plain_ddp_batches(planner):
    ref = plain_ddp(3, planner)
    for rank in range(WORLD):
        for even_batches in (True, False):
            s = sampler(planner=planner)
            loader = prepared(GlobalBatchSampler(s), rank, even_batches=even_batches)
            for e in range(3):
                s.set_epoch(e)
                assert len(loader) == len(ref[rank][e])
                assert list(loader) == ref[rank][e]
            # resume in epoch 2 after 7 batches, as a restarted process would
            fresh = sampler(planner=planner)
            fresh.set_epoch(2)
            assert list(skip_first_batches(prepared(GlobalBatchSampler(fresh), rank), 7)) == ref[rank][2][7:]
    for e in range(3):
        check_epoch([ref[r][e] for r in range(WORLD)])


def test_fixed_length_epochs_lay_planned_epochs_end_to_end():
    ref = plain_ddp(5)
    view = FixedLengthEpochs(sampler())
    assert view.steps == len(ref[0][0])
    assert len({len(ref[0][e]) for e in range(5)}) > 1  # planned epochs differ in length (greedy)
    for rank in range(WORLD):
        loader = prepared(view, rank)
        got = []
        for j in range(4):
            view.set_epoch(j)
            batches = list(loader)
            assert len(batches) == len(loader) == view.steps
            got += batches
        stream = [b for e in range(5) for b in ref[rank][e]]
        assert got == stream[: len(got)]
        view.set_epoch(3)  # any epoch can be entered directly (a resumed run)
        assert list(skip_first_batches(loader, 5)) == got[3 * view.steps + 5:]


def test_views_check_their_sampler():
    with pytest.raises(TypeError, match="DynamicBatchSampler"):
        GlobalBatchSampler([[0, 1], [2]])
    with pytest.raises(ValueError, match="epoch"):
        FixedLengthEpochs(sampler()).set_epoch(-1)


def test_streaming_batches_through_prepare_raises(tmp_path):
    brace, _, _ = write_corpus(tmp_path, [12, 9], seed=2)
    index_corpus(brace)
    for dispatch in (False, True):
        ds = StreamingBatches(brace, rank=0, world_size=WORLD, **STREAM)
        loader = prepare_data_loader(DataLoader(ds, batch_size=None), num_processes=WORLD, process_index=0,
                                     put_on_device=dispatch, dispatch_batches=dispatch)
        with pytest.raises(ValueError, match="accelerator.prepare"):
            next(iter(loader))


# ---------------------------------------------------------------- two processes (gloo), real Accelerator

K = 9  # batches of epoch 1 trained before the interruption
STREAM = dict(max_batch_tokens=400, max_batch_size=12, window_samples=60)


def _accelerator(stateful=False, dispatch=None):
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(use_stateful_dataloader=stateful, dispatch_batches=dispatch)
    return Accelerator(cpu=True, dataloader_config=config)


def _loader(acc, s, num_workers=0):
    # fork the workers: in a process started by spawn they would be spawned
    # too, each importing torch and accelerate again (slow on 2 cores)
    return acc.prepare(DataLoader(Echo(), batch_sampler=GlobalBatchSampler(s), collate_fn=list,
                                  num_workers=num_workers, multiprocessing_context="fork" if num_workers else None))


def _errors(fn) -> str:
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return ""


def _map_style(rank, port, out):
    rank_env(rank, port)
    acc = _accelerator()
    result: dict = {}
    # the naive wiring, and the other wrong ones, raise on every process (no hang, no loss)
    naive = DynamicBatchSampler(lengths(), BUDGET, CAP, rank=None, world_size=None)
    result["naive"] = _errors(lambda: next(iter(acc.prepare(DataLoader(Echo(), batch_sampler=naive,
                                                                       collate_fn=list)))))
    result["unprepared"] = _errors(lambda: next(iter(DataLoader(Echo(), batch_sampler=GlobalBatchSampler(naive)))))
    dispatching = _accelerator(dispatch=True)
    result["dispatch"] = _errors(lambda: next(iter(dispatching.prepare(
        DataLoader(Echo(), batch_sampler=GlobalBatchSampler(naive), collate_fn=list)))))
    result["naive dispatch"] = _errors(lambda: next(iter(dispatching.prepare(
        DataLoader(Echo(), batch_sampler=naive, collate_fn=list)))))
    # the recipe: two epochs, with DataLoader workers
    s = DynamicBatchSampler(lengths(), BUDGET, CAP, rank=None, world_size=None)
    loader = _loader(acc, s, num_workers=2)
    result["epochs"] = []
    for e in range(2):
        s.set_epoch(e)
        result["epochs"].append(list(loader))
    # a restarted process resumes epoch 1 after K batches with skip_first_batches
    fresh = DynamicBatchSampler(lengths(), BUDGET, CAP, rank=None, world_size=None)
    fresh.set_epoch(1)
    result["skipped"] = list(acc.skip_first_batches(_loader(acc, fresh), K))
    write_json(os.path.join(out, f"rank{rank}.json"), result)


@pytest.mark.slow
def test_two_processes_map_style(tmp_path):
    mp.start_processes(_map_style, args=(free_port(), str(tmp_path)), nprocs=WORLD, start_method="spawn")
    results = read_ranks(tmp_path)
    ref = plain_ddp(2)
    for r, res in enumerate(results):
        assert "GlobalBatchSampler" in res["naive"] and "already the batches of rank" in res["naive"]
        assert "every process would train on every batch" in res["unprepared"]
        assert "dispatch_batches=True" in res["dispatch"] and "dispatch_batches=True" in res["naive dispatch"]
        assert res["epochs"] == ref[r]
        assert res["skipped"] == ref[r][1][K:]
    for e in range(2):
        check_epoch([res["epochs"][e] for res in results])


def _stateful(rank, port, out, phase):
    """save: epoch 0, then K batches of epoch 1 and save_state; load: a new
    process loads the state and finishes epoch 1."""
    rank_env(rank, port)
    acc = _accelerator(stateful=True)
    s = DynamicBatchSampler(lengths(), BUDGET, CAP, rank=None, world_size=None, planner="bucketed")
    loader = _loader(acc, s, num_workers=2)
    state_dir = os.path.join(out, "state")
    got = []
    if phase == "save":
        s.set_epoch(0)
        got.append(list(loader))
        s.set_epoch(1)
        head = []
        for batch in loader:
            head.append(batch)
            if len(head) == K:
                acc.save_state(state_dir)
                break
        got.append(head)
    else:
        acc.load_state(state_dir)
        s.set_epoch(1)  # the epoch is the training script's to restore, as in a plain loop
        got.append(list(loader))
    write_json(os.path.join(out, f"{phase}{rank}.json"), got)


@pytest.mark.slow
def test_two_processes_resume_through_save_state(tmp_path):
    for phase in ("save", "load"):
        mp.start_processes(_stateful, args=(free_port(), str(tmp_path), phase), nprocs=WORLD, start_method="spawn")
    saved, loaded = read_ranks(tmp_path, "save{r}.json"), read_ranks(tmp_path, "load{r}.json")
    ref = plain_ddp(2, "bucketed")
    for r in range(WORLD):
        assert saved[r][0] == ref[r][0]
        assert saved[r][1] + loaded[r][0] == ref[r][1]  # nothing lost, nothing repeated
    check_epoch([saved[r][1] + loaded[r][0] for r in range(WORLD)])


# ---------------------------------------------------------------- StreamingBatches beside accelerate

@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus([31, 27, 40, 22, 35], seed=5, name="acc")
    return c.brace, c.expected


def _streaming(rank, port, out, pattern, phase):
    from accelerate.utils import send_to_device
    from torchdata.stateful_dataloader import StatefulDataLoader

    rank_env(rank, port)
    acc = _accelerator()
    ds = StreamingBatches(pattern, **STREAM)
    result: dict = {}
    if phase == "save":
        result["prepared"] = _errors(lambda: next(iter(acc.prepare(DataLoader(ds, batch_size=None)))))
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    acc.register_for_checkpointing(loader)
    state_dir = os.path.join(out, "state")
    keys = lambda batch: [s["__key__"] for s in send_to_device(batch, acc.device)]
    if phase == "save":
        ds.set_epoch(0)
        result["epoch0"] = [keys(b) for b in loader]
        ds.set_epoch(1)
        head, k = [], len(ds) // 2
        for batch in loader:
            head.append(keys(batch))
            if len(head) == k:
                acc.save_state(state_dir)
                break
        result["head"] = head
    else:
        acc.load_state(state_dir)
        ds.set_epoch(1)
        result["tail"] = [keys(b) for b in loader]
    write_json(os.path.join(out, f"{phase}{rank}.json"), result)


@pytest.mark.slow
def test_two_processes_streaming_resume(corpus, tmp_path):
    pattern, expected = corpus
    for phase in ("save", "load"):
        mp.start_processes(_streaming, args=(free_port(), str(tmp_path), pattern, phase), nprocs=WORLD,
                           start_method="spawn")
    saved, loaded = read_ranks(tmp_path, "save{r}.json"), read_ranks(tmp_path, "load{r}.json")
    for r in range(WORLD):
        assert "accelerator.prepare" in saved[r]["prepared"]
        assert saved[r]["head"] and loaded[r]["tail"]
        plain = StreamingBatches(pattern, rank=r, world_size=WORLD, **STREAM)
        plain.set_epoch(1)
        assert saved[r]["head"] + loaded[r]["tail"] == [[s["__key__"] for s in b] for b in plain]
    index = {k: i for i, k in enumerate(sorted(expected))}
    for epoch in ([s["epoch0"] for s in saved], [s["head"] + t["tail"] for s, t in zip(saved, loaded)]):
        check_epoch([[[index[k] for k in b] for b in batches] for batches in epoch], n=len(expected))
