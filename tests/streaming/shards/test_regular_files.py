"""Local shards are regular files (issue 32, items 7 and 14): a FIFO, a device, a directory, a socket, or a
symlink to any of them is refused by the indexer with one clear error naming what it is, before anything
opens it (``streambatch index`` on a FIFO or on a symlink to /dev/zero never returned). Real FIFOs, sockets
and /dev/zero here; each case is bounded by the test timeout (it hung before the fix)."""

from __future__ import annotations

import os
import socket

import pytest

from streambatch.cli.main import main
from streambatch.streaming import ShardError, StreamingBatches, index_shards

from shards import FPS, write_corpus


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
    index_shards(paths, frames_per_second=FPS, workers=1, progress=False)
    ds = StreamingBatches(paths, 400, 8, verify=False)
    os.unlink(paths[1])
    os.mkfifo(paths[1])
    with pytest.raises(ShardError, match="not a regular file"):
        list(ds)
