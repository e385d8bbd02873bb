"""Real WebDataset shards for the streaming tests.

Audio is generated with numpy and written as real WAV and FLAC files by
soundfile; samples carry a JSON member with their duration; shards are
written by webdataset's ShardWriter. Everything is tiny (8 kHz, < 0.7 s) so a
corpus of a few hundred samples costs a few MB and well under a second.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
import soundfile
import webdataset as wds

SAMPLE_RATE = 8000
FPS = 100  # planning frames per second of audio


def audio_bytes(frames: int, fmt: str, rng: np.random.Generator, channels: int = 1) -> bytes:
    """A real audio file (``fmt`` 'wav' or 'flac') of ``frames`` frames."""
    t = np.arange(frames) / SAMPLE_RATE
    tone = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 400) * t)
    x = (tone + 0.01 * rng.standard_normal(frames)).astype(np.float32)
    if channels > 1:
        x = np.stack([x] * channels, axis=1)
    buf = io.BytesIO()
    soundfile.write(buf, x, SAMPLE_RATE, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


def write_corpus(directory, sizes, seed: int = 0, prefix: str = "train", median: float = 0.15,
                 longest: float = 0.6) -> tuple[str, list[str], dict[str, int]]:
    """Write ``len(sizes)`` shards, shard i holding ``sizes[i]`` samples.

    Samples alternate WAV and FLAC, durations log-normal around ``median`` s,
    clipped to [0.03, ``longest``] s.
    Returns (brace pattern, shard paths, {key: length in frames at FPS}).
    """
    rng = np.random.default_rng(seed)
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    pattern = os.path.join(directory, f"{prefix}-%06d.tar")
    expected: dict[str, int] = {}
    paths = [pattern % i for i in range(len(sizes))]
    n = 0
    for i, count in enumerate(sizes):
        with wds.TarWriter(paths[i]) as sink:  # one writer per shard: exact per-shard sizes, empty shards too
            for _ in range(count):
                frames = int(np.clip(np.exp(rng.normal(np.log(median), 0.6)), 0.03, longest) * SAMPLE_RATE)
                fmt = "flac" if n % 2 else "wav"
                key = f"{prefix}/s{n:07d}"
                duration = frames / SAMPLE_RATE
                sink.write({"__key__": key, fmt: audio_bytes(frames, fmt, rng),
                            "json": json.dumps({"duration": duration, "text": f"utt {n}"}).encode()})
                expected[key] = int(np.ceil(duration * FPS - 1e-6))
                n += 1
    brace = os.path.join(directory, f"{prefix}-{{{0:06d}..{len(sizes) - 1:06d}}}.tar")
    return brace, paths, expected


def write_with_shardwriter(directory, n_samples: int, maxcount: int, seed: int = 0) -> list[str]:
    """Shards cut by webdataset's ShardWriter (``maxcount`` samples each)."""
    rng = np.random.default_rng(seed)
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    with wds.ShardWriter(os.path.join(directory, "sw-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for n in range(n_samples):
            frames = int(rng.integers(240, 4000))
            fmt = "flac" if n % 2 else "wav"
            sink.write({"__key__": f"k{n:05d}", fmt: audio_bytes(frames, fmt, rng),
                        "json": json.dumps({"duration": frames / SAMPLE_RATE}).encode()})
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".tar"))


def wds_samples(urls) -> list[dict]:
    """Every sample as plain webdataset reads it (the reference for bytes)."""
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    return list(ds)
