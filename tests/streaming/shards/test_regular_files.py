"""Local shards are regular files (issue 32, items 7 and 14): a FIFO, a device, a directory, a socket, or a
symlink to any of them is refused by the indexer with one clear error naming what it is, before anything
opens it (``streambatch index`` on a FIFO or on a symlink to /dev/zero never returned). The other corpus
formats' local files (Parquet files, NeMo manifests, Shar cuts files) likewise. Real FIFOs, sockets and
/dev/zero here; each case is bounded by the test timeout (it hung before the fix)."""

from __future__ import annotations

import os
import socket

import pytest

from streambatch.cli.main import main
from streambatch.streaming import ShardError, StreamingBatches, index_shards
from tests.support.corpora import write_nemo, write_parquet, write_shar
from tests.support.corpus import index_corpus
from tests.support.shards import FPS, write_corpus


@pytest.fixture
def corpus(tmp_path):
    _, paths, _ = write_corpus(tmp_path / "ok", [6, 5], seed=5)
    return tmp_path, paths


def special(tmp_path, kind: str) -> str:
    """A path ending in .tar that is not a regular file."""
    path = str(tmp_path / f"{kind}.tar")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo-link":
        os.mkfifo(str(tmp_path / "real-fifo"))
        os.symlink(str(tmp_path / "real-fifo"), path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    return path


WHAT = {"fifo": "a FIFO", "zero": "a character device", "fifo-link": "a FIFO", "socket": "a socket"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(WHAT))
def test_index_refuses_what_is_not_a_regular_file(corpus, kind):
    tmp_path, paths = corpus
    bad = special(tmp_path, kind)
    with pytest.raises(ShardError, match=rf"{WHAT[kind]}.*not a regular file") as info:
        index_shards([paths[0], bad], frames_per_second=FPS, workers=1, progress=False)
    assert os.path.basename(bad) in str(info.value)
    if kind.endswith("link") or kind == "zero":
        assert "symlink" in str(info.value)


def test_a_directory_named_like_a_shard_is_searched_for_shards(corpus):
    tmp_path, paths = corpus
    bad = special(tmp_path, "directory")  # a directory means the shards under it (as on the command line)
    with pytest.raises(ValueError, match=r"directory.tar is a directory without .tar shards"):
        index_shards([paths[0], bad], frames_per_second=FPS, workers=1, progress=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_cli_index_refuses_them_in_one_line(corpus, kind, capsys):
    tmp_path, paths = corpus
    bad = special(tmp_path, kind)
    assert main(["index", paths[0], bad, "--frames-per-second", str(FPS), "--no-progress", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streambatch: error:") and "not a regular file" in err and err.count("\n") == 1


@pytest.mark.timeout(60)
def test_streaming_with_index_missing_refuses_a_fifo(corpus):
    tmp_path, paths = corpus
    bad = special(tmp_path, "fifo")
    with pytest.raises(ShardError, match="a FIFO.*not a regular file"):
        StreamingBatches([paths[0], bad], 400, 8, index_missing=True, frames_per_second=FPS)


@pytest.mark.timeout(60)
def test_a_shard_replaced_by_a_fifo_after_indexing_is_refused_when_read(corpus):
    tmp_path, paths = corpus
    index_corpus(paths)
    ds = StreamingBatches(paths, 400, 8, verify=False)
    os.unlink(paths[1])
    os.mkfifo(paths[1])
    with pytest.raises(ShardError, match="not a regular file"):
        list(ds)


# ---------------------------------------------------------------- the other corpus formats' files
# Shar cuts files, NeMo manifests and Parquet files are read whole or by offset too: the same refusal, naming
# the kind of file (each case bounded by the test timeout: a FIFO would block, /dev/zero never end).


def fifo_in_place_of(path: str) -> str:
    os.unlink(path)
    os.mkfifo(path)
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_parquet_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    pytest.importorskip("pyarrow")
    paths, _ = write_parquet(tmp_path / "pq", 12, files=2, rows_per_group=4, seed=1, writer="pyarrow")
    if kind == "fifo":
        fifo_in_place_of(paths[1])
    else:
        os.unlink(paths[1])
        os.symlink("/dev/zero", paths[1])
    with pytest.raises(ShardError, match=rf"Parquet file .*{WHAT[kind]}.*not a regular file") as info:
        StreamingBatches(paths, 800, 8, format="parquet", frames_per_second=FPS, rank=0, world_size=1)
    assert os.path.basename(paths[1]) in str(info.value)


@pytest.mark.timeout(60)
def test_a_nemo_manifest_that_is_a_fifo_is_refused(tmp_path):
    directory, _ = write_nemo(tmp_path / "nemo", 8, num_shards=2, seed=1)
    fifo_in_place_of(os.path.join(directory, "tarred_audio_manifest.json"))
    with pytest.raises(ShardError, match=r"NeMo manifest .*a FIFO.*not a regular file"):
        StreamingBatches(directory, 800, 8, format="nemo", frames_per_second=FPS, rank=0, world_size=1)


@pytest.mark.timeout(60)
def test_a_shar_cuts_file_that_is_a_fifo_is_refused(tmp_path):
    pytest.importorskip("lhotse")
    directory, _ = write_shar(tmp_path / "shar", 8, shard_size=4, seed=1)
    cuts = sorted(n for n in os.listdir(directory) if n.startswith("cuts."))
    fifo_in_place_of(os.path.join(directory, cuts[-1]))
    with pytest.raises(ShardError, match=r"Shar cuts file .*a FIFO.*not a regular file"):
        StreamingBatches(directory, 800, 8, frames_per_second=FPS, rank=0, world_size=1)
