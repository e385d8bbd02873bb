"""Generated data for the examples: clip lengths, a toy dataset and model, and WebDataset shards.

Nothing here is part of streambatch: it stands in for your corpus and your model, so that
every example runs as it is, on any machine, in seconds.
"""

from __future__ import annotations

import io
import json
import os
import wave

import numpy as np
import torch
from torch.utils.data import Dataset

FEATURES = 16  # feature size of the toy clips
FPS = 50  # planning frames per second of audio: a length is ceil(seconds x 50)


def clip_lengths(n: int, seed: int = 0) -> np.ndarray:
    """(n,) int64 clip lengths in frames: log-normal, median 200 (4 s at 50 frames/s)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(200), 0.6, n), 10, 1500).astype(np.int64)


class Clips(Dataset):
    """Item i: (i, a (lengths[i], FEATURES) float32 clip). Stands in for your map-style dataset."""

    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(int(i))
        return i, torch.randn(int(self.lengths[i]), FEATURES, generator=g)


def pad(items):
    """Collate (index, clip) pairs: {"index": (B,), "x": (B, longest, FEATURES), "mask": (B, longest)}."""
    index = torch.tensor([i for i, _ in items])
    clips = [c for _, c in items]
    x = torch.nn.utils.rnn.pad_sequence(clips, batch_first=True)
    mask = torch.arange(x.shape[1])[None, :] < torch.tensor([len(c) for c in clips])[:, None]
    return {"index": index, "x": x, "mask": mask}


class TinyModel(torch.nn.Module):
    """A model small enough to train on a CPU: a linear layer and a masked mean-square loss."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(FEATURES, FEATURES)

    def forward(self, x, mask, **_):
        err = (self.proj(x) - x).pow(2).mean(-1)
        return (err * mask).sum() / mask.sum().clamp(min=1)


def write_shards(directory: str, shards: int = 8, per_shard: int = 40, seed: int = 0, prefix: str = "train",
                 sample_rate: int = 8000) -> str:
    """Write ``shards`` WebDataset tar shards of generated utterances to ``directory``.

    Each sample has a ``wav`` member (16-bit PCM, a tone of the utterance's duration) and a
    ``json`` member with its ``duration`` in seconds, as most speech corpora store it. Returns the
    brace pattern naming the shards, e.g. ``DIR/train-{000000..000007}.tar``.
    """
    import webdataset as wds

    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    n = 0
    for s in range(shards):
        with wds.TarWriter(os.path.join(directory, f"{prefix}-{s:06d}.tar")) as sink:
            for _ in range(per_shard):
                seconds = float(np.clip(rng.lognormal(np.log(2.0), 0.6), 0.3, 12.0))
                t = np.arange(int(seconds * sample_rate)) / sample_rate
                pcm = (3000 * np.sin(2 * np.pi * rng.uniform(100, 300) * t)).astype("<i2")
                buf = io.BytesIO()
                with wave.open(buf, "wb") as w:
                    w.setnchannels(1)
                    w.setsampwidth(2)
                    w.setframerate(sample_rate)
                    w.writeframes(pcm.tobytes())
                meta = {"duration": round(len(pcm) / sample_rate, 4), "text": f"utterance {n}"}
                sink.write({"__key__": f"{prefix}/{n:07d}", "wav": buf.getvalue(), "json": json.dumps(meta).encode()})
                n += 1
    return os.path.join(directory, f"{prefix}-{{000000..{shards - 1:06d}}}.tar")
