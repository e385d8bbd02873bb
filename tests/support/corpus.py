"""The shared corpus fixture: real tar shards (``shards.write_corpus``) indexed with sidecars, one spelling.

``make_corpus(sizes, seed, ...)`` (a module-scoped fixture, registered for every test by ``tests/conftest.py``)
writes a corpus into a fresh temporary folder and indexes it; each test module keeps its own corpora, so a module
that damages its shards damages nobody else's. ``index_corpus(urls, ...)`` is the indexing call the tests make
(``index_shards`` at the test frame rate, one worker, no progress bar)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.shards import FPS, write_corpus


def index_corpus(urls: Any, **kwargs: Any) -> Any:
    """``index_shards(urls, frames_per_second=FPS, workers=1, progress=False, **kwargs)``: its IndexSummary."""
    from streambatch.streaming import index_shards

    kwargs.setdefault("frames_per_second", FPS)
    return index_shards(urls, workers=1, progress=False, **kwargs)


@dataclass(frozen=True)
class Corpus:
    """directory: where the shards are; brace: their brace pattern; paths: one per shard; expected: {key: length
    in frames at FPS}; pipes: ``pipe:cat PATH`` URLs; index_dir: where their sidecars are (when indexed)."""

    directory: str
    brace: str
    paths: list[str]
    expected: dict[str, int]
    pipes: list[str]
    index_dir: str | None


def indexed_corpus(directory: Any, sizes: Sequence[int], seed: int = 0, *, local: bool = True, pipes: bool = False,
                   **write: Any) -> Corpus:
    """Write ``sizes`` (samples per shard) into ``directory`` and index them: ``local``: sidecars beside the
    shards; ``pipes``: the ``pipe:cat`` URLs into ``directory/idx``. write: ``write_corpus``'s prefix, median,
    longest."""
    directory = os.fspath(directory)
    brace, paths, expected = write_corpus(directory, sizes, seed=seed, **write)
    if local:
        index_corpus(brace)
    urls = [f"pipe:cat {p}" for p in paths]
    idx = os.path.join(directory, "idx") if pipes else None
    if pipes:
        index_corpus(urls, index_dir=idx)
    return Corpus(directory, brace, paths, expected, urls, idx)


@pytest.fixture(scope="module")
def make_corpus(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Corpus]:
    """``make_corpus(sizes, seed=0, name="corpus", local=True, pipes=False, prefix=..., median=..., longest=...)``:
    an indexed corpus in a fresh temporary folder (see ``indexed_corpus``)."""

    def make(sizes: Sequence[int], seed: int = 0, *, name: str = "corpus", **kwargs: Any) -> Corpus:
        return indexed_corpus(tmp_path_factory.mktemp(name), sizes, seed, **kwargs)

    return make
