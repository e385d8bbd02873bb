"""Streaming decode against a plain webdataset pipeline, side by side (issue 23 item 3).

    PYTHONPATH=$PWD .venv/bin/python bench/decode.py                # the table (~3 min on 2 busy cores)
    PYTHONPATH=$PWD .venv/bin/python bench/decode.py --profile      # cProfile of one worker-less pass each
    PYTHONPATH=$PWD .venv/bin/python bench/decode.py --digest F     # write a digest of every batch to F

The same 32 FLAC shards (written once under --out and reused), the same ``DataLoader`` settings
(``num_workers=2, batch_size=None``), with decode (both sides collate with ``collate_audio``) and without
(raw sample dicts, lists of them as batches). webdataset batches with ``.batched(B)`` where B is the mean
batch size of streambatch's plan. Passes alternate between the two contenders; CPU seconds count the main
process and its (reaped) DataLoader workers. Medians over the passes; ratios are ours / webdataset.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

from streambatch.cli.corpus import make_shards
from streambatch.streaming import StreamingBatches, collate_audio, decode_audio, index_shards

RATE = 16000
FPS = 50


def corpus(out: str, shards: int, per_shard: int) -> list[str]:
    d = os.path.join(out, f"decode-{shards}x{per_shard}")
    paths = [os.path.join(d, f"demo-{i:06d}.tar") for i in range(shards)]
    if not all(os.path.exists(p) for p in paths):
        make_shards(d, shards, per_shard, seed=0, sample_rate=RATE, median_seconds=2.0, speech="generated")
    index_shards(paths, frames_per_second=FPS, workers=2, progress=False)
    return paths


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def ours(paths, decode: bool, tokens: int, **kw):
    return StreamingBatches(paths, tokens, 64, rank=0, world_size=1, decode="audio" if decode else None,
                            collate_fn=collate_audio if decode else None, **kw)


def plain(paths, decode: bool, batch: int):
    import webdataset as wds

    ds = wds.WebDataset(paths, shardshuffle=False, nodesplitter=wds.single_node_only,
                        workersplitter=wds.split_by_worker, empty_check=False)
    if decode:
        ds = ds.map(decode_audio)
    return ds.batched(batch, collation_fn=collate_audio if decode else None, partial=True)


def count(batch) -> int:
    return len(batch["keys"]) if isinstance(batch, dict) else len(batch)


def run_pass(ds, workers: int) -> tuple[int, float, float]:
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    t, c = time.perf_counter(), cpu_seconds()
    n = sum(count(b) for b in loader)
    del loader
    return n, time.perf_counter() - t, cpu_seconds() - c


def table(paths, passes: int, tokens: int, workers: int) -> None:
    probe = ours(paths, False, tokens)
    steps = len(probe)
    n = sum(len(b) for b in probe)
    mean = n / steps
    batch = max(1, round(mean))
    print(f"corpus: {len(paths)} FLAC shards, {n} samples; streambatch plan: {steps} steps, mean batch "
          f"{mean:.2f} -> webdataset .batched({batch}); DataLoader(num_workers={workers}, batch_size=None); "
          f"{passes} interleaved passes, medians")
    print("| decode | pipeline | samples/s (wall) | CPU s / 1k samples | ratio samples/s | ratio CPU |")
    print("|---|---|---:|---:|---:|---:|")
    for decode in (True, False):
        contenders = {"webdataset": lambda d=decode: plain(paths, d, batch),
                      "streambatch": lambda d=decode: ours(paths, d, tokens)}
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
        for p in range(passes + 1):
            order = list(contenders) if p % 2 == 0 else list(contenders)[::-1]
            for name in order:
                got, wall, cpu = run_pass(contenders[name](), workers)
                assert got == n, (name, got, n)
                if p:  # the first round warms caches (page cache, imports, numba)
                    res[name].append((n / wall, 1000 * cpu / n))
        med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in res.items()}
        w, s = med["webdataset"], med["streambatch"]
        for name, (rate, cpu) in med.items():
            ratio = (s[0] / w[0], w[1] / s[1]) if name == "streambatch" else (1.0, 1.0)
            print(f"| {'yes' if decode else 'no'} | {name} | {rate:,.0f} | {cpu:.3f} | {ratio[0]:.2f}× | "
                  f"{ratio[1]:.2f}× |", flush=True)
    print("ratio CPU = webdataset's CPU s per sample / ours (above 1: ours costs less)")


def profile(paths, tokens: int) -> None:
    import cProfile
    import pstats

    probe = ours(paths, False, tokens)
    batch = max(1, round(sum(len(b) for b in probe) / len(probe)))
    for name, make in (("webdataset", lambda: plain(paths, True, batch)),
                       ("streambatch", lambda: ours(paths, True, tokens))):
        ds = make()
        sum(count(b) for b in ds)  # warm
        pr = cProfile.Profile()
        pr.enable()
        sum(count(b) for b in ds)
        pr.disable()
        print(f"\n### {name} (decode + collate_audio, main process)")
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)


def digest_batch(h, b) -> None:
    if isinstance(b, dict):
        for k in sorted(b):
            h.update(k.encode())
            digest_batch(h, b[k])
    elif isinstance(b, (list, tuple)):
        h.update(f"[{type(b).__name__}{len(b)}".encode())
        for x in b:
            digest_batch(h, x)
    elif isinstance(b, torch.Tensor):
        h.update(f"T{b.dtype}{tuple(b.shape)}{b.stride()}".encode())
        h.update(b.contiguous().numpy().tobytes())
    elif isinstance(b, np.ndarray):
        h.update(f"A{b.dtype}{b.shape}".encode())
        h.update(b.tobytes())
    elif isinstance(b, (bytes, bytearray, memoryview)):
        h.update(b"B")
        h.update(bytes(b))
    else:
        h.update(f"{type(b).__name__}:{b!r}".encode())


def digests(paths, out: str, tokens: int) -> None:
    configs = [("decode+collate, 0 workers", dict(decode=True), 0),
               ("decode+collate, 2 workers", dict(decode=True), 2),
               ("raw, 0 workers", dict(decode=False), 0),
               ("raw, 2 workers", dict(decode=False), 2),
               ("decode+collate, read_mode=shard, 2 workers", dict(decode=True, read_mode="shard"), 2),
               ("raw, read_mode=shard, W=2 rank 1, 2 workers", dict(decode=False, read_mode="shard", rank=1), 2),
               ("decode only (no collate), 0 workers", dict(decode=True, collate=False), 0)]
    lines = []
    for name, kw, workers in configs:
        kw = dict(kw)
        decode, collate, rank = kw.pop("decode"), kw.pop("collate", True), kw.pop("rank", None)
        if rank is None:
            ds = ours(paths, decode, tokens, **kw)
        else:
            ds = StreamingBatches(paths, tokens, 64, rank=rank, world_size=2, decode="audio" if decode else None,
                                  verify=False, **kw)
        if not collate:
            ds.options = dataclasses.replace(ds.options, output=dataclasses.replace(ds.options.output, collate_fn=None))
        h = hashlib.sha256()
        steps = 0
        for b in DataLoader(ds, batch_size=None, num_workers=workers):
            digest_batch(h, b)
            steps += 1
        lines.append(f"{name}: {steps} batches {h.hexdigest()}")
        print(lines[-1], flush=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/streambatch-bench")
    p.add_argument("--shards", type=int, default=32)
    p.add_argument("--per-shard", type=int, default=100)
    p.add_argument("--tokens", type=int, default=4000, help="max_batch_tokens (frames at 50/s)")
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--digest", metavar="FILE")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    paths = corpus(a.out, a.shards, a.per_shard)
    if a.digest:
        digests(paths, a.digest, a.tokens)
    elif a.profile:
        profile(paths, a.tokens)
    else:
        print(f"# streambatch decode benchmark (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f})")
        table(paths, a.passes, a.tokens, a.workers)


if __name__ == "__main__":
    main()
