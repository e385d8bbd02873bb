"""Batch-stream hashes of ``StreamingBatches`` and ``DynamicBatchSampler`` over random configurations.

    python bench/stream_hashes.py save base.json              # run here, store every hash
    python bench/stream_hashes.py check base.json             # run here, compare: exit 1 on any difference
    python bench/stream_hashes.py compare --old /path/to/old  # run this checkout and another, compare
    python bench/stream_hashes.py check base.json --only sampler  # one group (streaming sampler)

``bench/plan_hashes.py`` checks planner calls; this checks what a user gets from the two classes: every rank's
batches, in order, and the ``state_dict()`` after every step, for configurations drawn from a fixed seed:

- streaming (>= 160): ``read_mode`` sample and shard, one shard list or a mix of two (weights, samples, repeat),
  W 1-5, greedy, bucketed and packed (``pack=True``) planning, cost models and ``max_step_cost``, ``drop_last``
  and ``shuffle`` both ways, ``max_length``, epochs 0-2; a third of them saved after k steps and resumed at
  another (or the same) world size, every rank of the new world run to the end of the epoch;
- sampler (>= 80): lengths from 1 to 3,000 samples, greedy, bucketed and packed, mixes (``mixed`` with weights,
  samples or repeats), ``max_length``, and elastic resumes as above.

A configuration's hash covers its epoch summary (``len``, padding, drops), every rank's stream of batch keys (sample
keys, or dataset indices) and the JSON of every state. A configuration that raises records the exception's type and
message. The shards are tiny tars written with fixed content and mtimes, indexed by the measured checkout, in
``--data`` (default ``$TMPDIR/streambatch-stream-hashes``, reused when present, so ``save`` and a later ``check``
read the same files: the states' fingerprints hash the shard URLs and sidecars). ``compare`` builds them once and
runs both checkouts on them. Each run is a fresh process whose PYTHONPATH is the checkout measured. Never part of
the test run.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUPS = ("streaming", "sampler")
FPS = 100
MTIME = 1_700_000_000  # every tar member and shard file: fixed, so the sidecars (and fingerprints) are too
# corpus name -> shard sizes (samples); "b" is the second source of a mix
CORPORA = {"a": [37, 23, 41, 0, 29, 35, 18, 44, 31, 26, 39, 22], "b": [15, 28, 9, 33, 20, 17, 25],
           "c": [60, 55, 48, 70, 52, 65, 58, 61, 49, 57]}
N_STREAMING = 170
N_SAMPLER = 90


# ------------------------------------------------------------------------------------------------ data


def write_corpora(data: str) -> None:
    """Tar shards (a ``.bin`` payload and a ``.json`` duration per sample) with fixed content and mtimes, then
    their sidecars, written by the checkout on PYTHONPATH. Skipped when ``data`` already holds them."""
    done = os.path.join(data, "DONE")
    if os.path.exists(done):
        return
    from streambatch.streaming import index_shards

    rs = np.random.default_rng(2024)
    for name, sizes in CORPORA.items():
        d = os.path.join(data, name)
        os.makedirs(d, exist_ok=True)
        n = 0
        for i, count in enumerate(sizes):
            path = os.path.join(d, f"{name}-{i:06d}.tar")
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
                for _ in range(count):
                    seconds = float(np.clip(rs.lognormal(np.log(1.2), 0.7), 0.05, 9.0))
                    if rs.random() < 0.03:
                        seconds = float(rs.uniform(12.0, 20.0))  # a few outliers
                    key = f"{name}/s{n:06d}"
                    members = {"bin": bytes(rs.integers(0, 256, size=int(rs.integers(1, 40)), dtype=np.uint8)),
                               "json": json.dumps({"duration": round(seconds, 3)}).encode()}
                    for suffix, payload in members.items():
                        info = tarfile.TarInfo(f"{key}.{suffix}")
                        info.size, info.mtime, info.mode = len(payload), MTIME, 0o644
                        info.uname = info.gname = "x"
                        tar.addfile(info, io.BytesIO(payload))
                    n += 1
            os.utime(path, (MTIME, MTIME))
        index_shards(_brace(data, name), frames_per_second=FPS, workers=1, progress=False)
    with open(done, "w") as f:
        f.write("ok\n")


def _brace(data: str, name: str) -> str:
    return os.path.join(data, name, f"{name}-{{000000..{len(CORPORA[name]) - 1:06d}}}.tar")


# ------------------------------------------------------------------------------------------------ configurations


def streaming_configs() -> list[dict]:
    rs = np.random.default_rng(31)
    out = []
    costs = (None, None, "linear", "quadratic_duration", "step")
    for k in range(N_STREAMING):
        mix = None
        corpus = str(rs.choice(["a", "a", "c"]))
        if k % 4 == 1:
            mix = str(rs.choice(["weights", "samples", "repeat", "plain"]))
            corpus = "a"
        pack = bool(rs.random() < 0.25)
        planner = "bucketed" if pack else str(rs.choice(["greedy", "bucketed"]))
        c = dict(corpus=corpus, mix=mix, read_mode=str(rs.choice(["sample", "shard"])),
                 world=int(rs.integers(1, 6)), budget=int(rs.choice([300, 600, 1200, 2500])),
                 cap=int(rs.choice([4, 12, 64])), window=int(rs.choice([60, 90, 150, 400])),
                 drop_last=bool(rs.integers(0, 2)), shuffle=bool(rs.random() < 0.85),
                 seed=int(rs.integers(0, 2**31)), epoch=int(rs.integers(0, 3)), planner=planner, pack=pack,
                 cost=costs[int(rs.integers(0, len(costs)))] if planner == "bucketed" or k % 3 == 0 else None,
                 max_step_cost=bool(rs.random() < 0.15), max_length=int(rs.choice([0, 0, 0, 700, 1500])),
                 resume=None)
        if c["planner"] == "greedy" and c["read_mode"] == "sample":
            c["cost"], c["max_step_cost"] = None, False  # greedy takes no options (shard mode takes bucketed's)
        if k % 3 == 0:
            c["resume"] = dict(frac=float(rs.random()), world=int(rs.integers(1, 6)))
        out.append(c)
    return out


def sampler_configs() -> list[dict]:
    rs = np.random.default_rng(57)
    out = []
    for k in range(N_SAMPLER):
        pack = bool(rs.random() < 0.2)
        c = dict(n=int(rs.choice([7, 60, 400, 1500, 3000])) if k % 15 else 1, data_seed=int(rs.integers(0, 2**31)),
                 world=int(rs.integers(1, 9)), budget=int(rs.choice([200, 800, 4000, 16000])),
                 cap=int(rs.choice([1, 8, 32, 64])), drop_last=bool(rs.integers(0, 2)),
                 shuffle=bool(rs.random() < 0.85), seed=int(rs.integers(0, 2**31)), epoch=int(rs.integers(0, 3)),
                 planner="bucketed" if pack else str(rs.choice(["greedy", "bucketed"])), pack=pack,
                 mix=str(rs.choice(["weights", "samples", "repeat"])) if k % 3 == 1 else None,
                 max_length=int(rs.choice([0, 0, 300, 900])), resume=None)
        if c["planner"] == "bucketed":
            c["cost"] = (None, "linear", "quadratic_duration", "step")[int(rs.integers(0, 4))]
            c["max_step_cost"] = bool(rs.random() < 0.15)
        if k % 2 == 0:
            c["resume"] = dict(frac=float(rs.random()), world=int(rs.integers(1, 9)))
        out.append(c)
    return out


# ------------------------------------------------------------------------------------------------ runs


def _options(c: dict) -> dict:
    from streambatch.core.cost import CostModel

    o = {}
    if c["pack"]:
        o["pack"] = True
    if c.get("cost") == "quadratic_duration":
        o["cost"] = CostModel.quadratic_duration(300)
    elif c.get("cost") == "step":
        o["cost"] = CostModel.step(0.02, 1e-6, 2e-9)
    elif c.get("cost"):
        o["cost"] = c["cost"]
    if c.get("max_step_cost"):
        o["max_step_cost"] = 4e5 if c.get("cost") in (None, "quadratic_duration") else 3e3
        if c.get("cost") == "step":
            o["max_step_cost"] = 0.5
    return o


class _Stream:
    """A sha256 over everything a configuration yields."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def add(self, tag: str, value) -> None:
        self.h.update(tag.encode() + b"=" + json.dumps(value, sort_keys=True, default=str).encode() + b"\n")


def _summary(s) -> list:
    return [s.epoch, s.steps, s.samples, s.padded, s.dropped, list(s.window_steps), s.too_long]


def streaming_run(data: str, c: dict) -> str:
    from streambatch.streaming import Source, StreamingBatches

    if c["mix"] is None:
        urls = _brace(data, c["corpus"])
        extra = {}
    else:
        a, b = _brace(data, "a"), _brace(data, "b")
        extra = {}
        urls = {"weights": [Source(a, weight=0.7), Source(b, weight=0.3)],
                "samples": [Source(a, samples=200), Source(b, samples=90)],
                "repeat": [Source(a, repeat=1), Source(b, repeat=2)],
                "plain": [Source(a), Source(b)]}[c["mix"]]
        if c["mix"] == "weights":
            extra["samples_per_epoch"] = 380

    def make(rank: int, world: int):
        kw = dict(window_samples=c["window"], read_mode=c["read_mode"], shuffle=c["shuffle"],
                  drop_last=c["drop_last"], seed=c["seed"], rank=rank, world_size=world, planner=c["planner"],
                  verify=False, **extra, **_options(c))
        if c["max_length"]:
            kw["max_length"] = c["max_length"]
        return StreamingBatches(urls, c["budget"], c["cap"], **kw)

    out = _Stream()
    w = c["world"]
    ranks = [make(r, w) for r in range(w)]
    for ds in ranks:
        ds.set_epoch(c["epoch"])
    out.add("summary", _summary(ranks[0].epoch_summary()))
    out.add("len", len(ranks[0]))
    out.add("start", ranks[0].state_dict())
    stop = None if c["resume"] is None else int(round(c["resume"]["frac"] * len(ranks[0])))
    saved = None
    for r, ds in enumerate(ranks):
        for i, batch in enumerate(ds):
            out.add(f"r{r}", [s["__key__"] for s in batch])
            state = ds.state_dict()
            out.add(f"s{r}", state)
            if stop is not None and i + 1 == stop:
                saved = state if r == 0 else saved
                break
        if stop == 0 and r == 0:
            saved = ds.state_dict()
    if c["resume"] is None:
        return out.h.hexdigest()[:32]
    w2 = c["resume"]["world"]
    for r in range(w2):
        ds = make(r, w2)
        ds.load_state_dict(saved)
        if r == 0:
            out.add("resumed", [len(ds), _summary(ds.epoch_summary())])
        for batch in ds:
            out.add(f"e{r}", [s["__key__"] for s in batch])
            out.add(f"t{r}", ds.state_dict())
    return out.h.hexdigest()[:32]


def sampler_run(c: dict) -> str:
    from streambatch import DynamicBatchSampler

    rs = np.random.default_rng(c["data_seed"])
    lengths = np.clip(rs.lognormal(np.log(150), 0.8, c["n"]), 1, 2500).astype(np.int64)

    def make(rank: int, world: int):
        kw = dict(shuffle=c["shuffle"], drop_last=c["drop_last"], rank=rank, world_size=world, seed=c["seed"],
                  planner=c["planner"], **_options(c))
        if c["max_length"]:
            kw["max_length"] = c["max_length"]
        if c["mix"] is None:
            return DynamicBatchSampler(lengths, c["budget"], c["cap"], **kw)
        cut = max(1, lengths.shape[0] // 3)
        parts = [lengths[:cut], lengths[cut:]] if lengths.shape[0] > 1 else [lengths, lengths]
        spec = {"weights": dict(weights=[0.4, 0.6]), "samples": dict(samples=[len(parts[0]), 2 * len(parts[1])]),
                "repeat": dict(repeats=[2, 0.5])}[c["mix"]]
        return DynamicBatchSampler.mixed(parts, c["budget"], c["cap"], **spec, **kw)

    out = _Stream()
    w = c["world"]
    ranks = [make(r, w) for r in range(w)]
    for s in ranks:
        s.set_epoch(c["epoch"])
    out.add("len", [len(ranks[0]), ranks[0].num_padded, ranks[0].num_dropped, ranks[0].num_too_long])
    out.add("start", ranks[0].state_dict())
    stop = None if c["resume"] is None else int(round(c["resume"]["frac"] * len(ranks[0])))
    saved = None
    for r, s in enumerate(ranks):
        for i, batch in enumerate(s):
            out.add(f"r{r}", batch)
            state = s.state_dict()
            out.add(f"s{r}", state)
            if stop is not None and i + 1 == stop:
                saved = state if r == 0 else saved
                break
        if stop == 0 and r == 0:
            saved = s.state_dict()
    if c["resume"] is None:
        return out.h.hexdigest()[:32]
    w2 = c["resume"]["world"]
    for r in range(w2):
        s = make(r, w2)
        s.load_state_dict(saved)
        if r == 0:
            out.add("resumed", [len(s), s.base_step, s.num_padded, s.num_dropped])
        for batch in s:
            out.add(f"e{r}", batch)
            out.add(f"t{r}", s.state_dict())
    return out.h.hexdigest()[:32]


def _guard(fn, *args) -> str:
    try:
        return fn(*args)
    except (ValueError, TypeError, OverflowError) as e:
        return f"{type(e).__name__}: {e}"


def run_here(groups: list[str], data: str) -> dict[str, str]:
    import logging

    logging.disable(logging.WARNING)  # max_length and over-budget notices: the same on both sides, not measured
    write_corpora(data)
    out = {}
    if "streaming" in groups:
        for k, c in enumerate(streaming_configs()):
            out[f"streaming/{k}"] = _guard(streaming_run, data, c)
    if "sampler" in groups:
        for k, c in enumerate(sampler_configs()):
            out[f"sampler/{k}"] = _guard(sampler_run, c)
    return out


# ---------------------------------------------------------------------------------------------- parent side


def run_in(root: str, groups: list[str], data: str) -> dict[str, str]:
    """The hashes of the checkout at ``root`` (a fresh process importing it)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "_child", data, *groups], check=True,
                         capture_output=True, text=True, env=env, cwd=os.path.abspath(root))
    return json.loads(res.stdout.strip().splitlines()[-1])


def diff(base: dict[str, str], new: dict[str, str]) -> int:
    keys = sorted(set(base) & set(new))
    bad = [k for k in keys if base[k] != new[k]]
    missing = sorted(set(base) ^ set(new))
    counts: dict[str, list[int]] = {}
    for k in keys:
        c = counts.setdefault(k.split("/")[0], [0, 0])
        c[0] += 1
        c[1] += base[k] != new[k]
    for g, (n, b) in sorted(counts.items()):
        print(f"{g}: {n} configurations, {b} differ")
    for k in bad[:20]:
        print(f"  DIFFERS {k}: {base[k]} -> {new[k]}")
    if missing:
        print(f"  {len(missing)} configurations only on one side (first: {missing[:5]})")
    errors = sum(1 for v in new.values() if ":" in v)
    print(f"{len(keys)} compared, {len(bad)} differ; {errors} configurations raise (same on both sides)"
          if not bad else "BATCH STREAMS DIFFER")
    return 1 if bad or missing else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        print(json.dumps(run_here(sys.argv[3:], sys.argv[2])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["save", "check", "compare"])
    ap.add_argument("file", nargs="?", help="the stored hashes (save, check)")
    ap.add_argument("--old", help="the other checkout (compare)")
    ap.add_argument("--root", default=HERE, help="the checkout to run (default: this one)")
    ap.add_argument("--data", help="where the shards are written (default: $TMPDIR/streambatch-stream-hashes; "
                                   "compare: a fresh temporary folder)")
    ap.add_argument("--only", nargs="*", default=list(GROUPS), choices=GROUPS)
    a = ap.parse_args()
    if a.mode == "compare":
        if not a.old:
            ap.error("compare needs --old")
        with tempfile.TemporaryDirectory() as tmp:
            data = a.data or tmp
            return diff(run_in(a.old, a.only, data), run_in(a.root, a.only, data))
    if not a.file:
        ap.error(f"{a.mode} needs a file")
    data = a.data or os.path.join(tempfile.gettempdir(), "streambatch-stream-hashes")
    new = run_in(a.root, a.only, data)
    if a.mode == "save":
        with open(a.file, "w") as f:
            json.dump(new, f, indent=0, sort_keys=True)
        print(f"saved {len(new)} hashes to {a.file}")
        return 0
    with open(a.file) as f:
        base = json.load(f)
    return diff({k: v for k, v in base.items() if k.split("/")[0] in a.only}, new)


if __name__ == "__main__":
    sys.exit(main())
