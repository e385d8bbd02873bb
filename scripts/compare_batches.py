"""Digest the batches of a few hundred seeded random streaming configurations.

Run it before and after a refactoring and diff the two JSON files: any change
in plans or batches (keys, order, member bytes) of any rank shows up as a
different digest.

    PYTHONPATH=$PWD python scripts/compare_batches.py --out /tmp/before.json
    PYTHONPATH=$PWD python scripts/compare_batches.py --out /tmp/after.json
    diff /tmp/before.json /tmp/after.json

Each configuration draws: the shards (one corpus, or a mix of two through
``Source`` with weights, ``repeat`` or ``samples``), ``read_mode`` (sample or
shard), ``drop_last``, ``max_length``, budget, cap, ``window_samples``, seed,
epoch, 1-4 ranks (simulated with ``rank``/``world_size``, 0 workers) and, for
a third of them, an elastic resume: every rank of the first world takes ``k``
batches, rank 0's state is loaded by every rank of a second world (another
size), which finishes the epoch. The digest covers every rank's batches in
order: keys, member names and a sha256 of each member's bytes, plus ``len``
and the final state. The shards are written to a temporary folder by
``tests/support/shards.py`` (fixed seeds, so the same bytes on every run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # the repository root: tests.support

from streambatch.streaming import Source, StreamingBatches, index_shards  # noqa: E402
from tests.support.shards import FPS, write_corpus  # noqa: E402


def corpora(root: str) -> dict[str, str]:
    """Three small indexed corpora (brace patterns)."""
    out = {}
    for name, sizes, seed in (("a", [21, 17, 0, 25, 19, 23, 14, 22], 17), ("b", [9, 14, 7, 12], 4),
                              ("c", [30, 25, 35, 20, 28, 5], 3)):
        brace, _, _ = write_corpus(os.path.join(root, name), sizes, seed=seed, prefix=name)
        index_shards(brace, frames_per_second=FPS, workers=1, progress=False)
        out[name] = brace
    return out


def draw(i: int, srcs: dict[str, str]) -> dict:
    """Configuration ``i``: plain JSON-able settings."""
    rng = np.random.default_rng(1000 + i)
    cfg: dict = {"read_mode": str(rng.choice(["sample", "shard"])), "drop_last": bool(rng.random() < 0.4),
                 "max_length": None if rng.random() < 0.6 else int(rng.choice([30, 45, 60])),
                 "budget": int(rng.choice([200, 400, 700])), "cap": int(rng.choice([2, 4, 8, 16])),
                 "window": int(rng.choice([25, 40, 60, 150])), "seed": int(rng.integers(0, 1000)),
                 "shuffle": bool(rng.random() < 0.85), "epoch": int(rng.integers(0, 3)),
                 "world": int(rng.integers(1, 5))}
    if cfg["read_mode"] == "sample" and rng.random() < 0.3:
        cfg["planner"] = "greedy"
    kind = rng.random()
    if kind < 0.5:
        cfg["source"] = {"plain": str(rng.choice(["a", "c"]))}
    else:
        spec = str(rng.choice(["weight", "repeat", "samples"]))
        mix = []
        for name in ("a", "b"):
            if spec == "weight":
                mix.append([name, "weight", float(rng.choice([0.3, 0.5, 0.7]))])
            elif spec == "repeat":
                mix.append([name, "repeat", float(rng.choice([0.5, 1.0, 2.0]))])
            else:
                mix.append([name, "samples", int(rng.integers(10, 120))])
        cfg["source"] = {"mix": mix}
        if spec == "weight":
            cfg["samples_per_epoch"] = int(rng.choice([100, 200, 300]))
    if rng.random() < 0.33:
        w1 = int(rng.integers(1, 5))
        cfg["resume"] = {"world": w1 if w1 != cfg["world"] or rng.random() < 0.2 else w1 % 4 + 1,
                         "frac": float(rng.choice([0.2, 0.4, 0.6, 0.8]))}
    return cfg


def build(cfg: dict, srcs: dict[str, str], rank: int, world: int) -> StreamingBatches:
    kw = {"window_samples": cfg["window"], "read_mode": cfg["read_mode"], "drop_last": cfg["drop_last"],
          "max_length": cfg["max_length"], "seed": cfg["seed"], "shuffle": cfg["shuffle"]}
    if "planner" in cfg:
        kw["planner"] = cfg["planner"]
    if "samples_per_epoch" in cfg:
        kw["samples_per_epoch"] = cfg["samples_per_epoch"]
    if "plain" in cfg["source"]:
        urls = srcs[cfg["source"]["plain"]]
    else:
        urls = [Source(srcs[name], **{spec: value}) for name, spec, value in cfg["source"]["mix"]]
    return StreamingBatches(urls, cfg["budget"], cfg["cap"], rank=rank, world_size=world, **kw)


def digest_batch(h, batch) -> None:
    h.update(b"[")
    for sample in batch:
        for name in sorted(sample):
            value = sample[name]
            if name == "__url__":
                value = os.path.basename(value)  # the temp folder differs between runs
            if isinstance(value, str):
                value = value.encode()
            h.update(name.encode() + b"=" + hashlib.sha256(value).digest())
        h.update(b";")
    h.update(b"]")


def run_world(cfg, srcs, world, state=None, steps=None):
    """Every rank of ``world`` in this process; per-rank digests and rank 0's state after."""
    digests, state_after = [], None
    for r in range(world):
        ds = build(cfg, srcs, r, world)
        ds.set_epoch(cfg["epoch"])
        if state is not None:
            ds.load_state_dict(state)
        h = hashlib.sha256(f"len={len(ds)}".encode())
        for n, batch in enumerate(ds, 1):
            digest_batch(h, batch)
            if steps is not None and n >= steps:
                break
        st = ds.state_dict()
        h.update(json.dumps(st, sort_keys=True, default=str).encode())
        if r == 0:
            state_after = st
        digests.append(h.hexdigest())
    return digests, state_after


def one_config(cfg: dict, srcs: dict[str, str]) -> str:
    try:
        if "resume" not in cfg:
            digests, _ = run_world(cfg, srcs, cfg["world"])
        else:
            ds = build(cfg, srcs, 0, cfg["world"])
            ds.set_epoch(cfg["epoch"])
            k = max(1, int(cfg["resume"]["frac"] * len(ds)))
            head, state = run_world(cfg, srcs, cfg["world"], steps=k)
            tail, _ = run_world(cfg, srcs, cfg["resume"]["world"], state=state)
            digests = head + ["--"] + tail
    except Exception as exc:  # an error is part of the behaviour too
        msg = str(exc).split("\n")[0]
        return "error:" + type(exc).__name__ + ":" + msg[:200]
    return hashlib.sha256("|".join(digests).encode()).hexdigest()


def main() -> None:
    logging.getLogger("streambatch").setLevel(logging.ERROR)  # the max_length notices, once per dataset
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("-n", type=int, default=300, help="configurations (default 300)")
    args = p.parse_args()
    args.out = os.path.abspath(args.out)
    t0 = time.time()
    out = {}
    with tempfile.TemporaryDirectory() as root:
        os.chdir(root)  # relative shard URLs: the states' fingerprints cover the URLs, equal between runs
        srcs = corpora(".")
        for i in range(args.n):
            cfg = draw(i, srcs)
            out[f"{i:03d}"] = {"config": cfg, "digest": one_config(cfg, srcs)}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    errors = sum(v["digest"].startswith("error:") for v in out.values())
    print(f"{len(out)} configurations ({errors} raise) in {time.time() - t0:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
