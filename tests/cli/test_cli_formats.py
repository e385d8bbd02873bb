"""``streambatch plan`` and ``streambatch index`` on Lhotse Shar, NeMo tarred
and Parquet corpora (written by their own tools, tests/support/corpora.py): lengths
from the formats' metadata, the same numbers StreamingBatches plans from."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from streambatch.cli.main import main
from streambatch.streaming import StreamingBatches
from tests.support.corpora import FPS, write_nemo, write_parquet, write_shar


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-formats")
    shar, shar_exp = write_shar(d / "shar", 40, shard_size=15, seed=1)
    nemo, nemo_exp = write_nemo(d / "nemo", 30, num_shards=3, seed=2)
    paths, pq_exp = write_parquet(d / "pq", 50, files=2, rows_per_group=10, seed=3)
    return {"shar": (shar, None, shar_exp), "nemo": (os.path.join(nemo, "tarred_audio_manifest.json"), "nemo",
                                                     nemo_exp),
            "parquet": (os.path.join(d / "pq", "*.parquet"), None, pq_exp)}


@pytest.mark.parametrize("name", ["shar", pytest.param("nemo", marks=pytest.mark.slow),
                                  pytest.param("parquet", marks=pytest.mark.slow)])
def test_plan_reads_each_format(corpora, name, capsys):
    given, fmt, expected = corpora[name]
    argv = ["plan", given, "--fps", str(FPS), "-t", "800", "-w", "2", "--json"] + (["--format", fmt] if fmt else [])
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples"] == len(expected) and name in out["source"]
    ds = StreamingBatches(given, 800, 64, frames_per_second=FPS, rank=0, world_size=2, format=fmt)
    assert sorted(ds.catalog.all_lengths.astype(np.int64).tolist()) == sorted(expected.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shar", "nemo", "parquet"])
def test_index_summarises_without_writing(corpora, name, capsys, tmp_path):
    given, fmt, expected = corpora[name]
    before = sorted(os.listdir(os.path.dirname(given) if "*" in given or given.endswith(".json") else given))
    argv = ["index", given, "--fps", str(FPS)] + (["--format", fmt] if fmt else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"samples          {len(expected)}" in out and "no sidecar or catalog is needed" in out
    after = sorted(os.listdir(os.path.dirname(given) if "*" in given or given.endswith(".json") else given))
    assert before == after  # nothing written next to the corpus


@pytest.mark.slow
def test_a_json_manifest_stays_a_lengths_manifest(corpora, capsys):
    # without --format nemo a .json INPUT is read as JSON lines of lengths: the same lengths, no tar needed
    given, _, expected = corpora["nemo"]
    assert main(["plan", given, "--field", "duration", "--fps", str(FPS), "-t", "800", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples"] == len(expected) and "corpus" not in out["source"]
