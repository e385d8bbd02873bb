"""A shard whose name holds a line break cannot go into a catalog (its entries are newline-joined text): indexing
refuses it before any work, naming the shard and the fix, instead of writing a catalog that then fails to open
("3 entries where 2 were expected"; issue 32, item 20). Without a catalog such a shard indexes and streams."""

from __future__ import annotations

import os

import pytest

from streambatch.streaming import StreamingBatches, index_shards, open_catalog
from tests.support.shards import FPS, write_corpus


@pytest.fixture
def odd_names(tmp_path):
    _, paths, _ = write_corpus(tmp_path, [7, 5], seed=1)
    odd = os.path.join(tmp_path, "train\n000001.tar")
    os.rename(paths[1], odd)
    return [paths[0], odd]


def test_a_catalog_refuses_a_line_break_in_a_shard_name(odd_names, tmp_path):
    catalog = str(tmp_path / "c.catalog.npz")
    with pytest.raises(ValueError, match=r"line break.*rename the shard.*catalog=False") as info:
        index_shards(odd_names, frames_per_second=FPS, workers=1, progress=False, catalog=catalog)
    assert "train\\n000001.tar" in str(info.value)  # shown escaped, on one line
    assert not os.path.exists(catalog)
    assert not os.path.exists(odd_names[0] + ".idx.npz")  # refused before any work


def test_without_a_catalog_such_a_shard_streams(odd_names):
    index_shards(odd_names, frames_per_second=FPS, workers=1, progress=False, catalog=False)
    assert open_catalog(odd_names).num_samples == 12
    assert sum(len(b) for b in StreamingBatches(odd_names, 400, 8)) == 12
