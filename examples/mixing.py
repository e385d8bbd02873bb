"""Mixing corpora at chosen proportions: DynamicBatchSampler.mixed and StreamingBatches over Sources.

    python examples/mixing.py

An epoch draws each source's quota (weights split samples_per_epoch; or repeat factors, or fixed
counts); each source is read in cycles, every sample once per cycle, a fresh order each cycle.
The drawn samples are planned together, so every global step is still budgeted and balanced,
and the steps are ordered so that every stretch of the epoch holds the sources in proportion.
"""

from __future__ import annotations

import collections
import os
import tempfile

import numpy as np
from torch.utils.data import ConcatDataset, DataLoader

from streambatch import DynamicBatchSampler, Source, StreamingBatches, index_shards

from common import Clips, clip_lengths, pad, write_shards


class Concat(ConcatDataset):
    """ConcatDataset whose items carry their index in the concatenation (the sampler's indices)."""

    def __getitem__(self, i):
        return i, super().__getitem__(i)[1]


def map_style() -> None:
    corpora = {"en": clip_lengths(3000, seed=1), "zh": clip_lengths(1000, seed=2), "inhouse": clip_lengths(200, seed=3)}
    names = list(corpora)
    sampler = DynamicBatchSampler.mixed(list(corpora.values()), 16_000, 64, weights=[0.6, 0.3, 0.1],
                                        samples_per_epoch=3000, planner="bucketed")
    dataset = Concat([Clips(lengths) for lengths in corpora.values()])  # indices in the same order
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad)
    ends = np.cumsum([len(v) for v in corpora.values()])
    for epoch in range(2):
        sampler.set_epoch(epoch)
        drawn = collections.Counter()
        first_tenth = collections.Counter()
        for step, batch in enumerate(loader):
            source = np.searchsorted(ends, batch["index"].numpy(), side="right")
            drawn.update(source.tolist())
            if step < len(sampler) // 10:
                first_tenth.update(source.tolist())
        share = {n: round(drawn[i] / sum(drawn.values()), 3) for i, n in enumerate(names)}
        early = {n: round(first_tenth[i] / max(1, sum(first_tenth.values())), 2) for i, n in enumerate(names)}
        print(f"map-style epoch {epoch}: {len(sampler)} steps, shares {share}; in the first 10% of steps {early}; "
              f"cycles (cycle, position) {sampler.source_positions()}")


def streaming() -> None:
    with tempfile.TemporaryDirectory() as d:
        en = write_shards(os.path.join(d, "en"), shards=6, per_shard=40, seed=1, prefix="en")
        zh = write_shards(os.path.join(d, "zh"), shards=2, per_shard=40, seed=2, prefix="zh")
        index_shards([en, zh], length_from="json:duration", frames_per_second=50, progress=False)
        ds = StreamingBatches([Source(en, weight=0.5), Source(zh, weight=0.5)], 2_000, 32, samples_per_epoch=200)
        for epoch in range(2):
            ds.set_epoch(epoch)
            keys = [s["__key__"] for batch in DataLoader(ds, batch_size=None, num_workers=2) for s in batch]
            counts = collections.Counter(k.split("/")[0] for k in keys)
            print(f"streaming epoch {epoch}: {len(ds)} steps, {dict(counts)} (zh up-sampled: 80 clips, quota 100)")


if __name__ == "__main__":
    map_style()
    streaming()
