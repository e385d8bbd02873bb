"""BalancedCutSampler inside lhotse's own K2SpeechRecognitionDataset and a
torch DataLoader: eager CutSets and lazy Shar CutSets written by lhotse's
SharWriter, every cut once per epoch across ranks, equal steps, the
DynamicBucketingSampler arguments mapped onto the budget, exact and elastic
resume."""

from __future__ import annotations

import collections
import os
import re

import numpy as np
import pytest

lhotse = pytest.importorskip("lhotse")

from lhotse.dataset import AudioSamples, DynamicBucketingSampler, K2SpeechRecognitionDataset  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from streambatch.integrations.lhotse import BalancedCutSampler  # noqa: E402
from tests.support.corpora import clips, write_shar  # noqa: E402
from tests.support.roundtrip import check_state_roundtrip  # noqa: E402

N = 48


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    d = tmp_path_factory.mktemp("lhotse-eager")
    cuts = []
    for i, (data, _) in enumerate(clips(N, seed=21, fmt="wav")):
        path = d / f"u{i}.wav"
        path.write_bytes(data)
        rec = lhotse.Recording.from_file(path, recording_id=f"utt-{i:03d}")
        cut = rec.to_cut()
        cut.supervisions = [lhotse.SupervisionSegment(id=f"s{i}", recording_id=rec.id, start=0,
                                                      duration=rec.duration, text=f"hello {i}")]
        cuts.append(cut)
    return lhotse.CutSet.from_cuts(cuts)


@pytest.fixture(scope="module")
def shar(tmp_path_factory):
    directory, expected = write_shar(tmp_path_factory.mktemp("lhotse-shar"), N, shard_size=10, seed=22)
    return directory, expected


def ids(batch) -> tuple[str, ...]:
    return tuple(c.id for c in batch)


@pytest.mark.slow
def test_eager_cutset_in_k2_dataset_and_dataloader(eager):
    world, per_rank = 2, []
    for r in range(world):
        sampler = BalancedCutSampler(eager, max_duration=1.5, shuffle=True, world_size=world, rank=r, seed=3)
        dataset = K2SpeechRecognitionDataset(input_strategy=AudioSamples(), return_cuts=True)
        loader = DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=2)
        got = []
        for batch in loader:
            cuts = batch["supervisions"]["cut"]
            assert batch["inputs"].shape[0] == len(cuts)  # (B, T) audio samples of this rank's batch
            assert len(cuts) * max(c.duration for c in cuts) <= 1.5 + len(cuts) / 100  # padded duration in budget
            got.append(tuple(c.id for c in cuts))
        assert len(got) == len(sampler)
        per_rank.append(got)
    assert len({len(x) for x in per_rank}) == 1  # equal steps
    counts = collections.Counter(i for r in per_rank for b in r for i in b)
    assert set(counts) == {c.id for c in eager} and sum(counts.values()) - N < world


def test_shar_cutset_reads_only_its_cuts_audio(shar):
    directory, expected = shar
    cuts = lhotse.CutSet.from_shar(in_dir=directory)
    ref = {c.id: c.load_audio() for c in lhotse.CutSet.from_shar(in_dir=directory)}
    world, seen = 2, collections.Counter()
    for r in range(world):
        sampler = BalancedCutSampler(cuts, max_duration=2.0, max_cuts=6, shuffle=True, world_size=world, rank=r)
        sampler.set_epoch(1)
        assert len(list(sampler)) == len(sampler)  # an epoch, then another: the cuts are made afresh each time
        sampler.set_epoch(2)
        before = sampler.cuts._local.bytes_read
        for batch in sampler:
            assert 0 < len(batch) <= 6
            for cut in batch:
                np.testing.assert_allclose(cut.load_audio(), ref[cut.id], atol=1e-6)
                seen[cut.id] += 1
        tars = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.endswith(".tar"))
        assert 0 < sampler.cuts._local.bytes_read - before < 0.7 * tars  # its own cuts' members (~1/W), by offset
    assert set(seen) == set(expected)
    dataset = K2SpeechRecognitionDataset(input_strategy=AudioSamples(), return_cuts=True)
    loader = DataLoader(dataset, sampler=BalancedCutSampler(cuts, max_duration=2.0), batch_size=None, num_workers=2)
    assert sum(len(b["supervisions"]["cut"]) for b in loader) >= len(expected)


@pytest.mark.filterwarnings("ignore:You are using DynamicBucketingSampler with an eagerly read CutSet")
def test_arguments_map_onto_the_budget(eager):
    s = BalancedCutSampler(eager, max_duration=3.0, max_cuts=4, frames_per_second=50, num_buckets=30,
                           buffer_size=1000, quadratic_duration=15)  # lhotse's bucketing knobs: accepted, unused
    assert (s.max_batch_tokens, s.max_batch_size) == (150, 4)
    assert all(len(b) <= 4 for b in s)
    with pytest.raises(ValueError, match="seed must be an integer"):
        BalancedCutSampler(eager, max_duration=3.0, seed="randomized")
    with pytest.raises(ValueError, match="SamplingConstraint"):
        BalancedCutSampler(eager, max_duration=3.0, constraint=object())
    with pytest.raises(ValueError, match="max_duration"):
        BalancedCutSampler(eager)
    with pytest.raises(TypeError, match="CutSet"):
        BalancedCutSampler(list(eager), max_duration=3.0)
    # the same arguments as lhotse's own sampler: both cover the epoch, ours with equal steps per rank
    theirs = [list(DynamicBucketingSampler(eager.to_eager(), max_duration=1.5, world_size=2, rank=r, seed=1,
                                           shuffle=True))
              for r in range(2)]
    ours = [list(BalancedCutSampler(eager, max_duration=1.5, world_size=2, rank=r, seed=1, shuffle=True))
            for r in range(2)]
    for got in (theirs, ours):  # (lhotse pads its final step with copies marked _dupN)
        assert {re.sub(r"_dup\d+$", "", c.id) for r in got for b in r for c in b} == {c.id for c in eager}
    assert len(ours[0]) == len(ours[1])


@pytest.mark.parametrize("kwargs, meant", [
    ({"batch_size": 8}, "max_cuts"), ({"max_batch_size": 8}, "max_cuts"), ({"max_batch_tokens": 300}, "max_duration"),
    ({"max_tokens": 300}, "max_duration"), ({"max_cuts_": 8}, "max_cuts"), ({"world_sise": 2}, "world_size"),
])
def test_a_misspelled_keyword_names_the_samplers_own(eager, kwargs, meant):
    # unknown keywords go on to the planner's option check, whose hint names DynamicBatchSampler's keywords
    # (max_batch_size=, max_batch_tokens=): this sampler names its own (issue 32's hints with issue 33's sampler)
    with pytest.raises(TypeError, match=rf"{next(iter(kwargs))!r}: did you mean {meant}=") as info:
        BalancedCutSampler(eager, max_duration=3.0, **kwargs)
    assert "max_batch_size=" not in str(info.value) and "max_batch_tokens=" not in str(info.value)
    assert len(BalancedCutSampler(eager, max_duration=3.0, bucket_width=0.2)) > 0  # a planner option still passes


@pytest.mark.slow
def test_exact_resume(eager):
    check_state_roundtrip(lambda: BalancedCutSampler(eager, max_duration=1.5, shuffle=True, world_size=2, rank=1),
                          key=ids)


@pytest.mark.slow
def test_elastic_resume(shar):
    directory, expected = shar
    cuts = lhotse.CutSet.from_shar(in_dir=directory)
    w0, w1 = 4, 2
    head, state = [], None
    for r in range(w0):
        s = BalancedCutSampler(cuts, max_duration=1.5, shuffle=True, world_size=w0, rank=r)
        it = iter(s)
        k = len(s) // 3
        head += [ids(next(it)) for _ in range(k)]
        state = s.state_dict()
    tail, lens = [], set()
    for r in range(w1):
        s = BalancedCutSampler(cuts, max_duration=1.5, shuffle=True, world_size=w1, rank=r)
        s.load_state_dict(state)
        got = [ids(b) for b in s]
        lens.add(len(got))
        tail += got
    assert len(lens) == 1
    counts = collections.Counter(i for b in head + tail for i in b)
    assert set(counts) == set(expected) and sum(counts.values()) - len(expected) <= (w0 - 1) + (w1 - 1)
