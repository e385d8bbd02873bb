"""Corpus formats benchmark: the same utterances as WebDataset tars, Lhotse Shar
(lhotse's SharWriter), NeMo tarred audio (NeMo's tar layout) and Parquet
(``datasets``' to_parquet with an Audio column), side by side in one run:

1. planning from lengths alone: the seconds to every length and a planned
   epoch (StreamingBatches' constructor + ``epoch_summary``), against reading
   the lengths with each format's own reader;
2. streaming throughput with decode (one process, every sample, FLAC decoded by
   soundfile on both sides): StreamingBatches(decode="audio") against the
   format's own reader (lhotse's Shar reader + ``cut.load_audio()``, ``datasets``
   streaming of the Parquet files, plain tarfile iteration of the NeMo tars,
   webdataset for the tars); runs interleaved, median of ``--reps``;
3. bytes read per rank at W = 4 (every rank's ``bytes_read`` over the corpus'
   file bytes), in shard and sample read modes, and for Parquet at several
   row-group sizes.

    .venv/bin/python bench/formats.py            # ~3-5 min on 2 cores, ~150 MB under --out

The machine may be shared: timings are noisy, so each comparison is a ratio
measured in the same process, runs interleaved. Durations are the first
``--utts`` of a real corpus (/work/shared/data/real-lengths, else log-normal).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tarfile
import time

import numpy as np
import soundfile

from streambatch.streaming import StreamingBatches, index_shards

RATE, FPS, WORLD = 8000, 100, 4
HERE = os.path.dirname(os.path.abspath(__file__))
REAL = "/work/shared/data/real-lengths/voicebank-demand.npy"


def durations(n: int) -> tuple[np.ndarray, str]:
    if os.path.exists(REAL):
        return np.load(REAL)[:n], f"the first {n} VoiceBank-DEMAND utterances"
    rng = np.random.default_rng(0)
    return np.clip(np.exp(rng.normal(np.log(2.7), 0.4, n)), 1.0, 15.0), f"{n} log-normal durations (median 2.7 s)"


def clips(secs: np.ndarray) -> list[tuple[str, bytes, float]]:
    """(id, FLAC bytes, duration) of generated speech-like audio, reproducible."""
    rng = np.random.default_rng(1)
    out = []
    for i, d in enumerate(secs):
        n = int(round(d * RATE))
        t = np.arange(n) / RATE
        pitch = 120 + 40 * np.sin(2 * np.pi * 0.5 * t)
        x = 0.3 * np.sin(2 * np.pi * pitch * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
        x += 0.003 * rng.standard_normal(n)
        buf = io.BytesIO()
        soundfile.write(buf, x.astype(np.float32), RATE, format="FLAC", subtype="PCM_16")
        out.append((f"spk{i % 20:02d}.utt{i:05d}", buf.getvalue(), n / RATE))
    return out


def write_all(out: str, data, per_shard: int, row_groups: list[int]) -> dict[str, dict]:
    """Every format of the same clips; {name: {"given", "files"}}."""
    import webdataset as wds
    from datasets import Audio, Dataset
    from lhotse import CutSet, Recording, SupervisionSegment

    shutil.rmtree(out, ignore_errors=True)
    made: dict[str, dict] = {}
    shards = [data[i:i + per_shard] for i in range(0, len(data), per_shard)]
    # WebDataset tars (+ streambatch sidecars, written below and timed apart)
    d = os.path.join(out, "wds")
    os.makedirs(d)
    paths = []
    for k, part in enumerate(shards):
        p = os.path.join(d, f"train-{k:06d}.tar")
        with wds.TarWriter(p) as w:
            for key, flac, dur in part:  # (webdataset splits keys at their first dot)
                w.write({"__key__": key.replace(".", "_"), "flac": flac,
                         "json": json.dumps({"duration": dur, "text": key}).encode()})
        paths.append(p)
    made["webdataset"] = {"given": paths, "files": paths}
    # Lhotse Shar, by lhotse
    d = os.path.join(out, "shar")
    os.makedirs(d)
    cuts = []
    for key, flac, _ in data:
        rec = Recording.from_bytes(flac, recording_id=key)
        cut = rec.to_cut()
        cut.supervisions = [SupervisionSegment(id=key, recording_id=key, start=0, duration=rec.duration, text=key)]
        cuts.append(cut)
    CutSet.from_cuts(cuts).to_shar(d, fields={"recording": "flac"}, shard_size=per_shard)
    made["shar"] = {"given": d, "files": [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tar")]}
    # NeMo tarred audio, in the layout of NeMo's converter
    d = os.path.join(out, "nemo")
    os.makedirs(d)
    with open(os.path.join(d, "tarred_audio_manifest.json"), "w") as m:
        for k, part in enumerate(shards):
            with tarfile.open(os.path.join(d, f"audio_{k}.tar"), "w") as tar:
                for key, flac, dur in part:
                    name = key.replace(".", "_") + ".flac"
                    info = tarfile.TarInfo(name)
                    info.size = len(flac)
                    tar.addfile(info, io.BytesIO(flac))
                    m.write(json.dumps({"audio_filepath": name, "duration": dur, "text": key, "shard_id": k}) + "\n")
    made["nemo"] = {"given": os.path.join(d, "tarred_audio_manifest.json"),
                    "files": [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tar")]}
    # Parquet, by datasets (one file per shard), at each row-group size
    for rg in row_groups:
        d = os.path.join(out, f"parquet-rg{rg}")
        os.makedirs(d)
        files = []
        for k, part in enumerate(shards):
            cols = {"audio": [{"bytes": f, "path": key + ".flac"} for key, f, _ in part],
                    "text": [key for key, _, _ in part], "duration": [dur for _, _, dur in part]}
            p = os.path.join(d, f"train-{k:05d}-of-{len(shards):05d}.parquet")
            Dataset.from_dict(cols).cast_column("audio", Audio()).to_parquet(p, batch_size=rg)
            files.append(p)
        made[f"parquet-rg{rg}"] = {"given": os.path.join(d, "*.parquet"), "files": files}
    return made


# ------------------------------------------------------------ 1. lengths and a plan

def plan_ours(given) -> tuple[float, int]:
    t = time.perf_counter()
    ds = StreamingBatches(given, 40 * FPS, 64, frames_per_second=FPS, rank=0, world_size=WORLD)
    steps = ds.epoch_summary().steps
    return time.perf_counter() - t, steps


def lengths_own(name: str, given) -> float:
    t = time.perf_counter()
    if name == "shar":
        from lhotse import CutSet

        cut_files = sorted(os.path.join(given, f) for f in os.listdir(given) if f.startswith("cuts."))
        n = sum(1 for _ in (c.duration for c in CutSet.from_shar(fields={"cuts": cut_files})))
    elif name == "nemo":
        with open(given) as f:
            n = sum(1 for line in f if json.loads(line)["duration"] >= 0)
    elif name.startswith("parquet"):
        from datasets import load_dataset

        ds = load_dataset("parquet", data_files=given, split="train", streaming=True).select_columns(["duration"])
        n = sum(1 for _ in ds)
    else:  # webdataset: no metadata apart from the samples: read every sample's json member
        import webdataset as wds

        n = sum(1 for _ in wds.WebDataset(given, shardshuffle=False, empty_check=False).select(lambda s: "json" in s))
    assert n > 0
    return time.perf_counter() - t


# ------------------------------------------------------------ 2. throughput with decode

def decode_bytes(data: bytes) -> int:
    x, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return x.shape[0]


def stream_ours(given) -> tuple[float, int]:
    t = time.perf_counter()
    ds = StreamingBatches(given, 40 * FPS, 64, frames_per_second=FPS, rank=0, world_size=1, decode="audio")
    n = sum(len(b) for b in ds)
    return time.perf_counter() - t, n


def stream_own(name: str, given) -> tuple[float, int]:
    t = time.perf_counter()
    n = 0
    if name == "shar":
        from lhotse import CutSet

        for cut in CutSet.from_shar(in_dir=given):
            cut.load_audio()
            n += 1
    elif name == "nemo":
        with open(given) as f:
            entries = {e["audio_filepath"]: e for e in map(json.loads, f)}
        d = os.path.dirname(given)
        for tar_name in sorted(f for f in os.listdir(d) if f.endswith(".tar")):
            with tarfile.open(os.path.join(d, tar_name), "r|") as tar:
                for member in tar:
                    if member.name in entries:
                        decode_bytes(tar.extractfile(member).read())
                        n += 1
    elif name.startswith("parquet"):
        from datasets import Audio, load_dataset

        ds = load_dataset("parquet", data_files=given, split="train", streaming=True)
        for row in ds.cast_column("audio", Audio(decode=False)):  # (Audio decoding needs torchcodec)
            decode_bytes(row["audio"]["bytes"])
            n += 1
    else:
        import webdataset as wds

        for s in wds.WebDataset(given, shardshuffle=False, empty_check=False):
            decode_bytes(s["flac"])
            n += 1
    return time.perf_counter() - t, n


# ------------------------------------------------------------ 3. bytes per rank

def bytes_per_rank(given, files: list[str], read_mode: str) -> tuple[float, float]:
    total = sum(os.path.getsize(f) for f in files)
    read = []
    for r in range(WORLD):
        ds = StreamingBatches(given, 40 * FPS, 64, frames_per_second=FPS, rank=r, world_size=WORLD,
                              read_mode=read_mode, window_samples=2_000)
        for _ in ds:
            pass
        read.append(ds.bytes_read / total)
    return float(np.mean(read)), float(np.max(read))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--utts", type=int, default=1200)
    ap.add_argument("--per-shard", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "formats"))
    ap.add_argument("--json", default=os.path.join(HERE, "out", "formats.json"))
    args = ap.parse_args()
    secs, what = durations(args.utts)
    row_groups = sorted({25, 100, args.per_shard})
    t = time.perf_counter()
    made = write_all(args.out, clips(secs), args.per_shard, row_groups)
    print(f"{args.utts} clips ({what}), {args.per_shard} per shard, FLAC at {RATE} Hz: written in "
          f"{time.perf_counter() - t:.1f} s; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    t = time.perf_counter()
    index_shards(made["webdataset"]["given"], frames_per_second=FPS, workers=1, progress=False)
    wds_index = time.perf_counter() - t
    plan_ours(made["shar"]["given"])  # compile / warm the planner once, outside the timings
    names = ["webdataset", "shar", "nemo", f"parquet-rg{100}"]
    result: dict = {"clips": args.utts, "durations": what, "per_shard": args.per_shard, "world": WORLD,
                    "webdataset_index_seconds": wds_index, "plan": {}, "stream": {}, "bytes": {}}
    for name in names:
        given = made[name]["given"]
        ours, own = [], []
        for _ in range(args.reps):  # interleaved
            ours.append(plan_ours(given)[0])
            own.append(lengths_own(name, given))
        result["plan"][name] = {"streambatch_s": statistics.median(ours), "own_reader_s": statistics.median(own)}
        print(f"plan {name:14s} streambatch {statistics.median(ours):.3f} s (lengths + planned epoch, W={WORLD}); "
              f"own reader's lengths {statistics.median(own):.3f} s", flush=True)
    for name in names:
        given = made[name]["given"]
        ours, own, n = [], [], 0
        for _ in range(args.reps):
            s, n = stream_ours(given)
            ours.append(s)
            own.append(stream_own(name, given)[0])
        a, b = statistics.median(ours), statistics.median(own)
        result["stream"][name] = {"samples": n, "streambatch_per_s": n / a, "own_reader_per_s": n / b,
                                  "ratio": b / a}
        print(f"stream {name:14s} streambatch {n / a:7.0f} samples/s, own reader {n / b:7.0f} samples/s "
              f"(x{b / a:.2f})", flush=True)
    for name in ["webdataset", "shar", "nemo", *(f"parquet-rg{rg}" for rg in row_groups)]:
        for mode in ("shard", "sample"):
            mean, top = bytes_per_rank(made[name]["given"], made[name]["files"], mode)
            result["bytes"][f"{name}/{mode}"] = {"mean": mean, "max": top}
            print(f"bytes {name:14s} {mode:6s} per rank at W={WORLD}: mean {mean:.3f}, max {top:.3f} of the "
                  "corpus", flush=True)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
