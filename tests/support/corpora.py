"""Real corpora of the other formats for the tests, written by each format's own tools.

- ``write_shar``: lhotse's own ``CutSet.to_shar`` (``SharWriter``): cuts files and recording tars.
- ``write_nemo``: NeMo's tarred layout as NeMo's ``convert_to_tarred_audio_dataset.py`` writes it
  (``audio_N.tar`` of flattened file names, ``tarred_audio_manifest.json`` with ``shard_id``,
  ``sharded_manifests/manifest_N.json``), a file used twice listed as NeMo's ``-sub1`` entry. NeMo
  itself is not installed here (a multi-GB toolkit): the tars are written with ``tarfile`` exactly as
  its script does.
- ``write_parquet``: Hugging Face ``datasets`` (``Dataset.to_parquet`` with an ``Audio`` column), or
  pyarrow directly (``writer="pyarrow"``), with ``rows_per_group`` rows per row group.

Audio is real FLAC/WAV from numpy (8 kHz, short). Each writer returns what it wrote and
``expected``: sample key -> planning length at ``FPS`` frames per second.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import soundfile

from tests.support.shards import FPS  # planning frames per second, as for the tar corpora

SAMPLE_RATE = 8000


def frames_of(duration: float) -> int:
    return int(np.ceil(duration * FPS - 1e-6))


def clips(n: int, seed: int = 0, fmt: str = "flac", lo: int = 300, hi: int = 4800) -> list[tuple[bytes, float]]:
    """``n`` (audio file bytes, duration in s) of log-uniform lengths between ``lo`` and ``hi`` frames."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        frames = int(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        x = (0.2 * np.sin(np.arange(frames) * rng.uniform(0.01, 0.2)) + 0.01 * rng.standard_normal(frames))
        buf = io.BytesIO()
        soundfile.write(buf, x.astype(np.float32), SAMPLE_RATE, format=fmt.upper(), subtype="PCM_16")
        out.append((buf.getvalue(), frames / SAMPLE_RATE))
    return out


def write_shar(directory, n: int, shard_size: int, seed: int = 0) -> tuple[str, dict[str, int]]:
    """A Shar corpus written by lhotse (``CutSet.to_shar``, FLAC recordings); cut ids hold dots."""
    from lhotse import CutSet, Recording, SupervisionSegment

    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    cuts, expected = [], {}
    for i, (data, _) in enumerate(clips(n, seed, "wav")):
        rec = Recording.from_bytes(data, recording_id=f"spk{i % 7}.utt{i:05d}")
        cut = rec.to_cut()
        cut.supervisions = [SupervisionSegment(id=f"sup{i}", recording_id=rec.id, start=0, duration=rec.duration,
                                               text=f"utterance {i}")]
        cuts.append(cut)
        expected[cut.id] = frames_of(cut.duration)
    CutSet.from_cuts(cuts).to_shar(directory, fields={"recording": "flac"}, shard_size=shard_size)
    return directory, expected


def write_nemo(directory, n: int, num_shards: int, seed: int = 0) -> tuple[str, dict[str, int]]:
    """A NeMo tarred corpus as ``convert_to_tarred_audio_dataset.py`` writes it (sort_in_shards, no
    slicing). The source files sit in nested folders (flattened into member names, dots made
    underscores); the second entry reuses the first one's file (NeMo's ``-sub1`` entry). Returns the
    directory and {member key: length}."""
    directory = os.fspath(directory)
    src = os.path.join(directory, "source", "wavs")
    os.makedirs(src, exist_ok=True)
    entries = []
    for i, (data, duration) in enumerate(clips(n, seed, "wav")):
        path = os.path.join(src, f"book{i % 3}", f"utt.{i:05d}.wav")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        entries.append({"audio_filepath": path, "duration": duration, "text": f"utterance {i}"})
    entries.insert(1, dict(entries[0], text="the same file again"))  # a file listed twice: NeMo's -sub1
    per = len(entries) // num_shards
    os.makedirs(os.path.join(directory, "sharded_manifests"), exist_ok=True)
    expected: dict[str, int] = {}
    everything = []
    for sid in range(num_shards):
        shard = sorted(entries[sid * per:(sid + 1) * per] if sid < num_shards - 1 else entries[sid * per:],
                       key=lambda e: e["duration"])
        count: dict[str, int] = {}
        new = []
        with tarfile.open(os.path.join(directory, f"audio_{sid}.tar"), "w") as tar:
            for e in shard:
                base, ext = os.path.splitext(e["audio_filepath"])
                base = base.replace("/", "_").replace(".", "_")  # NeMo's flattened member names
                squashed = base + ext
                if squashed not in count:
                    tar.add(e["audio_filepath"], arcname=squashed)
                    name, count[squashed] = squashed, 1
                else:
                    name = f"{base}-sub{count[squashed]}{ext}"
                    count[squashed] += 1
                new.append({**e, "audio_filepath": name, "shard_id": sid})
                expected[os.path.splitext(name)[0]] = frames_of(e["duration"])
        with open(os.path.join(directory, "sharded_manifests", f"manifest_{sid}.json"), "w") as f:
            for e in new:
                f.write(json.dumps(e) + "\n")
        everything += new
    with open(os.path.join(directory, "tarred_audio_manifest.json"), "w") as f:
        for e in everything:
            f.write(json.dumps(e) + "\n")
    return directory, expected


def write_parquet(directory, n: int, files: int, rows_per_group: int, seed: int = 0, writer: str = "datasets",
                  prefix: str = "train") -> tuple[list[str], dict[str, int]]:
    """``files`` Parquet files holding ``n`` rows (an ``Audio`` column of FLAC bytes, ``text``,
    ``duration`` in seconds), ``rows_per_group`` rows per row group. Keys: ``<file name>/<row>``."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    data = clips(n, seed, "flac")
    per = -(-n // files)
    paths, expected = [], {}
    for k in range(files):
        part = data[k * per:(k + 1) * per]
        name = f"{prefix}-{k:05d}-of-{files:05d}.parquet"
        path = os.path.join(directory, name)
        cols = {"audio": [{"bytes": b, "path": f"clip{k}_{j}.flac"} for j, (b, _) in enumerate(part)],
                "text": [f"utterance {k}.{j}" for j in range(len(part))],
                "duration": [d for _, d in part]}
        if writer == "datasets":
            from datasets import Audio, Dataset  # the Hub's writer; Audio encoding needs no decoder

            Dataset.from_dict(cols).cast_column("audio", Audio()).to_parquet(path, batch_size=rows_per_group)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table(cols), path, row_group_size=rows_per_group)
        paths.append(path)
        for j, (_, d) in enumerate(part):
            expected[f"{name}/{j}"] = frames_of(d)
    return paths, expected
