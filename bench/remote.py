"""Remote-storage benchmark: shards served over HTTP by nginx on 127.0.0.1
(tests/servers.py), with a fault proxy adding per-request latency.

    python bench/remote.py            # everything (~5 min on 2 cores, ~300 MB of /tmp)
    python bench/remote.py --quick    # smaller corpora (~1 min)

Reports, from the server's access log (bytes and requests as served):
1. bytes and GET requests per rank over one epoch at W = 4, 8, 16, 64 (ranks
   simulated one after another), in each read mode this build has;
2. samples/s of one rank (W = 4, rank 0) against a plain webdataset
   pipeline reading that rank's quarter of the shards through its own HTTP
   opener (pipe:curl), with 0 and 50 ms added per request;
3. StreamingBatches construction time from a local catalog of 10k and 100k shards;
4. remote indexing: bytes and GETs against shard bytes (16 kHz speech, 2-5 s);
5. resident memory while streaming 1,000 remote shards.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # the repository root: tests.support

from streambatch.cli.corpus import make_shards  # noqa: E402
from streambatch.streaming import StreamingBatches, index_shards  # noqa: E402
from streambatch.streaming.shards.catalog_file import catalog_arrays, write_catalog  # noqa: E402
from tests.support.servers import FaultProxy, nginx_server  # noqa: E402

BUDGET, CAP, FPS = 16000, 64, 50
MODES = ["sample", "shard"] if "read_mode" in inspect.signature(StreamingBatches).parameters else ["sample"]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def corpus(root: str, name: str, shards: int, per_shard: int, rate: int, median: float, fmt: str = "flac"):
    d = os.path.join(root, name)
    paths = [os.path.join(d, f"{name}-{i:06d}.tar") for i in range(shards)]
    if not all(os.path.exists(p) for p in paths):
        make_shards(d, shards, per_shard, seed=1, sample_rate=rate, median_seconds=median, speech="generated",
                    audio_format=fmt, prefix=name)
    return d, paths


def served_index(ng, name: str, paths: list[str], root: str) -> str:
    """Index the served shards over HTTP (sidecars and catalog in a local dir); returns the catalog."""
    idx = os.path.join(root, name + "-idx")
    urls = [f"{ng.url}/{os.path.basename(p)}" for p in paths]
    index_shards(urls, frames_per_second=FPS, index_dir=idx, progress=False, workers=8)
    return os.path.join(idx, "streambatch.catalog.npz")


def tar_gets(ng):
    return [e for e in ng.log() if e.method == "GET" and e.path.endswith(".tar")]


def make_ds(source, mode, **kw):
    if len(MODES) > 1:
        kw["read_mode"] = mode
    return StreamingBatches(source, BUDGET, CAP, verify=False, **kw)


# ---------------------------------------------------------------- 1. bytes and requests per rank


def per_rank_io(root: str, quick: bool) -> None:
    shards, per = (64, 30) if quick else (256, 40)
    d, paths = corpus(root, "io", shards, per, 8000, 0.6)
    total = sum(os.path.getsize(p) for p in paths)
    print(f"\n## 1. Bytes and requests per rank, one epoch ({shards} shards, {shards * per:,} samples, "
          f"{total / 2**20:.0f} MiB)")
    print("| read mode | W | bytes per rank / (epoch bytes / W): mean, max | GETs, all ranks / shards | s |")
    print("|---|---:|---|---:|---:|")
    with nginx_server(d) as ng:
        cat = served_index(ng, "io", paths, root)
        for mode in MODES:
            for world in (4, 8, 16, 64):
                per_rank, gets, t0 = [], 0, time.perf_counter()
                with tempfile.TemporaryDirectory() as cache:
                    for r in range(world):
                        ng.clear_log()
                        ds = make_ds(cat, mode, rank=r, world_size=world, cache_dir=cache)
                        for _ in ds:
                            pass
                        log = tar_gets(ng)
                        per_rank.append(sum(e.body_bytes for e in log))
                        gets += len(log)
                share = np.array(per_rank) / (total / world)
                print(f"| {mode} | {world} | {share.mean():.2f}, {share.max():.2f} | {gets / shards:.2f} | "
                      f"{time.perf_counter() - t0:.0f} |", flush=True)


# ---------------------------------------------------------------- 2. samples/s against webdataset


def throughput(root: str, quick: bool, repeats: int) -> None:
    import webdataset as wds

    shards, per = (16, 40) if quick else (32, 60)
    d, paths = corpus(root, "tp", shards, per, 16000, 1.0)
    world, rank = 4, 0
    print(f"\n## 2. Samples/s of one rank (W = {world}, rank {rank}; {shards} shards of {per}; raw bytes, no "
          "decode; best of %d, interleaved)" % repeats)
    print("| latency per request | webdataset (pipe:curl) | " + " | ".join(f"StreamingBatches {m}" for m in MODES)
          + " |")
    print("|---|---:|" + "---:|" * len(MODES))
    with nginx_server(d) as ng:
        cat = served_index(ng, "tp", paths, root)
        for latency in (0.0, 0.05):
            with FaultProxy(ng.port) as px:
                px.latency = latency
                base = px.url if latency else ng.url
                mine = [f"{base}/{os.path.basename(p)}" for p in paths[rank::world]]

                def plain(mine=mine):
                    return sum(1 for _ in wds.WebDataset(mine, shardshuffle=False, empty_check=False))

                def ours(mode, latency=latency, px=px):
                    with tempfile.TemporaryDirectory() as cache:
                        ds = make_ds(cat if not latency else _via(cat, ng.url, px.url, root, mode), mode,
                                     rank=rank, world_size=world, cache_dir=cache)
                        t0 = time.perf_counter()
                        n = sum(len(b) for b in ds)
                        return n, time.perf_counter() - t0

                best = {}
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    n = plain()
                    best["wds"] = max(best.get("wds", 0), n / (time.perf_counter() - t0))
                    for m in MODES:
                        n, dt = ours(m)
                        best[m] = max(best.get(m, 0), n / dt)
                row = f"| {latency * 1000:.0f} ms | {best['wds']:,.0f} | " + " | ".join(
                    f"{best[m]:,.0f} ({best[m] / best['wds']:.2f}x)" for m in MODES) + " |"
                print(row, flush=True)


def _via(cat: str, old: str, new: str, root: str, mode: str) -> str:
    """A copy of the catalog whose shard URLs go through the proxy."""
    from streambatch.streaming.shards.catalog_file import read_catalog

    c = read_catalog(cat)
    out = os.path.join(root, f"via-{mode}-{abs(hash(new)) % 10**6}.catalog.npz")
    metas = [{"etag": e or None, "digest": g, "size": int(z)} for e, g, z in zip(c["etags"], c["digests"], c["sizes"])]
    starts = np.concatenate([[0], np.cumsum(c["counts"])])
    lengths = [c["lengths"][starts[i]: starts[i + 1]] for i in range(len(c["urls"]))]
    meta, arrays = catalog_arrays([u.replace(old, new) for u in c["urls"]], c["sidecars"], metas, lengths,
                                  c["meta"]["length_from"], at=out)
    write_catalog(out, meta, arrays)
    return out


# ---------------------------------------------------------------- 3. catalog construction


def catalog_construction(root: str, quick: bool) -> None:
    print("\n## 3. StreamingBatches construction from a local catalog (100 samples per shard; best of 3)")
    print("| shards | samples | catalog MiB | construct (s) |")
    print("|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for shards in ((10_000,) if quick else (10_000, 100_000)):
        path = os.path.join(root, f"synthetic-{shards}.catalog.npz")
        if not os.path.exists(path):
            urls = [f"s3://bench-bucket/train/train-{i:06d}.tar" for i in range(shards)]
            lengths = [rng.integers(25, 1500, 100) for _ in range(shards)]
            metas = [{"etag": f"{i:032x}", "digest": f"{i:016x}", "size": 1 << 26} for i in range(shards)]
            meta, arrays = catalog_arrays(urls, [u + ".idx.npz" for u in urls], metas, lengths,
                                          "json:duration*50/s", at=path)
            write_catalog(path, meta, arrays)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            StreamingBatches(path, BUDGET, CAP, verify=False, rank=0, world_size=8)
            best = min(best, time.perf_counter() - t0)
        print(f"| {shards:,} | {shards * 100:,} | {os.path.getsize(path) / 2**20:.1f} | {best:.2f} |", flush=True)


# ---------------------------------------------------------------- 4. remote indexing


def remote_indexing(root: str, quick: bool) -> None:
    print("\n## 4. Remote indexing over HTTP: what `streambatch index` reads (16 kHz speech, median 2-4 s)")
    print("| audio | median s | length from | shard MiB | bytes read / shard bytes | bytes per sample "
          "| GETs per sample |")
    print("|---|---:|---|---:|---:|---:|---:|")
    shards, per = (4, 25) if quick else (8, 50)
    for fmt in ("flac", "wav"):
        for median in (2.0, 4.0):
            name = f"ix{fmt}{int(median)}"
            d, paths = corpus(root, name, shards, per, 16000, median, fmt)
            total = sum(os.path.getsize(p) for p in paths)
            with nginx_server(d) as ng:
                urls = [f"{ng.url}/{os.path.basename(p)}" for p in paths]
                for spec in ("json:duration", "audio"):
                    ng.clear_log()
                    with tempfile.TemporaryDirectory() as idx:
                        index_shards(urls, length_from=spec, frames_per_second=FPS, index_dir=idx, progress=False,
                                     workers=8, catalog=False)
                    log = [e for e in ng.log() if e.method == "GET"]
                    read = sum(e.body_bytes for e in log)
                    n = shards * per
                    print(f"| {fmt} | {median:g} | {spec} | {total / 2**20:.1f} | {read / total:.2%} | "
                          f"{read / n:,.0f} | {len(log) / n:.2f} |", flush=True)


# ---------------------------------------------------------------- 5. memory


def memory(root: str, quick: bool) -> None:
    shards = 200 if quick else 1000
    d, paths = corpus(root, "mem", shards, 10, 8000, 0.3)
    print(f"\n## 5. Resident memory streaming {shards:,} remote shards ({shards * 10:,} samples, one rank)")
    with nginx_server(d) as ng:
        cat = served_index(ng, "mem", paths, root)
        for mode in MODES:
            with tempfile.TemporaryDirectory() as cache:
                ds = make_ds(cat, mode, rank=0, world_size=1, cache_dir=cache, window_samples=500)
                marks = []
                for i, _ in enumerate(ds):
                    if i in (len(ds) // 10, len(ds) - 1):
                        marks.append(rss_mb())
            print(f"- {mode} mode: RSS {marks[0]:.1f} MB after 10% of the epoch, {marks[-1]:.1f} MB at its end "
                  f"({marks[-1] - marks[0]:+.1f} MB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "streambatch-bench-remote"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="*", choices=["io", "throughput", "catalog", "indexing", "memory"])
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    only = set(a.only or ["io", "throughput", "catalog", "indexing", "memory"])
    print(f"read modes in this build: {MODES}")
    if "io" in only:
        per_rank_io(a.out, a.quick)
    if "throughput" in only:
        throughput(a.out, a.quick, a.repeats)
    if "catalog" in only:
        catalog_construction(a.out, a.quick)
    if "indexing" in only:
        remote_indexing(a.out, a.quick)
    if "memory" in only:
        memory(a.out, a.quick)


if __name__ == "__main__":
    main()
