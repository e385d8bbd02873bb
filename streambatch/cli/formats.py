"""Corpus formats on the command line: which INPUTs of ``streambatch plan`` and
``streambatch index`` are Lhotse Shar, NeMo tarred or Parquet corpora, and
their lengths, read from the format's own metadata (``streaming/shards/corpora``).

Detected without ``--format``: a directory holding Shar cuts files, Parquet
files and patterns. A ``.json`` INPUT stays a JSON-lines manifest of lengths
(a NeMo manifest plans the same from it); ``--format nemo`` reads it as a NeMo
tarred corpus, with its tars.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def corpus_of(text: str, fmt: str | None) -> tuple[Any, Any] | None:
    """(format, spec) when INPUT ``text`` is a corpus of another format than WebDataset tars, else None."""
    from ..streaming.shards.corpora import resolve  # lazy for start-up: --help needs no torch

    if fmt is None:
        found, spec = resolve(text)
        return (found, spec) if found.name in ("shar", "parquet") else None
    found, spec = resolve(text, fmt)
    return None if found.name == "webdataset" else (found, spec)


def length_source(fmt: Any, field: str | None) -> str:
    """``--field`` as the format's length source: a cut / manifest field, or a Parquet column."""
    if fmt.name == "parquet":
        return f"column:{field or 'duration'}"
    return f"json:{field or 'duration'}"


def corpus_lengths(text: str, found: tuple[Any, Any], field: str | None, fps: float | None,
                   storage_options: dict | None = None, length_from: str | None = None) -> tuple[np.ndarray, str]:
    """(N,) int64 lengths of a corpus INPUT and how to name it in the report (``length_from``: a whole
    length source, e.g. ``audio``, instead of ``--field``'s)."""
    from ..streaming.shards.corpora import OpenSettings

    fmt, spec = found
    cat = spec.open(OpenSettings(length_from or length_source(fmt, field), fps, storage_options))
    lengths = cat.all_lengths.astype(np.int64)
    shards = len(cat.urls)
    return lengths, f"a {fmt.name} corpus ({shards} {'file' if fmt.name == 'parquet' else 'shard'}" \
                    f"{'s' * (shards != 1)})"


def describe_corpus(text: str, found: tuple[Any, Any], length_from: str | None, fps: float | None,
                    storage_options: dict | None) -> None:
    """What ``streambatch index`` prints for a corpus that needs no index: its lengths, read from its metadata
    (``length_from``: ``--length-from``, default the format's)."""
    from .report import audio_time

    fmt, _ = found
    source = length_from or length_source(fmt, None)
    lengths, name = corpus_lengths(text, found, None, fps, storage_options, source)
    print(f"{name}: lengths from its own metadata ({source}"
          f"{f' at {fps:g} frames/s' if fps else ''}); no sidecar or catalog is needed")
    total = f"{int(lengths.sum()):,}" + (f" frames = {audio_time(lengths.sum() / fps)}" if fps else "")
    print(f"  samples          {lengths.size:,}")
    print(f"  total length     {total}")
    if lengths.size:
        qs = np.percentile(lengths, [0, 5, 50, 95, 100], method="nearest").astype(np.int64)
        print("  length           " + ", ".join(f"{k} {v:,}" for k, v in zip(("min", "p5", "p50", "p95", "max"), qs)))
    flag = f" --format {fmt.name}" + (f" --fps {fps:g}" if fps else "")
    print(f"next: streambatch plan '{text}'{flag} --max-batch-tokens 16000 --world-size 8")
