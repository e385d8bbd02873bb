"""Steps against the fewest any plan can have, before and after (issue 30).

    python bench/steps.py                          # this tree against ../baseline (main before the change)
    python bench/steps.py --baseline /path/to/tree --quick

Both trees run in fresh subprocesses (PYTHONPATH = the tree), in one run, on the shared real length files
(``../shared/data/real-lengths``: LibriSpeech train-clean-100, Common Voice Indonesian and Pashto,
VoiceBank-DEMAND; seconds -> frames = ceil(s * 50)); the fewest steps come from this tree's
``core/bounds.py`` (the baseline has none), for both. Cap 64, seed 0, epoch 0, default options.

1. The table: 4 corpora x W in {8, 64, 512} x budgets {0.5, 1, 2, 4} x the corpus's longest clip, the
   bucketed planner (padded), map-style: steps / fewest, padding (real / padded tokens), balance (per step,
   sum of the W batch costs B*L^2 / (W x the largest), mean over steps) and the planned epoch under
   B*L^2 plus a per-step term c0 (sum over steps of c0 + the costliest batch; c0 = 10 % of a full batch of
   median-length samples, min(64, budget // median) * median^2: the per-step cost of a GPU step,
   optimizer, all-reduce and launches, against the compute of a full batch), and under the fitted step
   model of bench/model.py (0.01729 + 2.998e-05*B*L + 7.865e-09*B*L^2 s, fitted on CPU in
   docs/performance.md), after / before.
2. The wide grid: 4 corpora x W in {1, 2, 4, ..., 128} x 20 budgets from 0.5 to 4 x the longest clip (640
   plans) for the padded and packed bucketed planner (map-style), and 8 budgets (256 epochs) for
   StreamingBatches in each read mode (shards of 500-2,000 samples, bench/affinity.py's layout, default
   windows): how many plans exceed 1.05 x fewest + 1 (shard mode: also 1.10 x), the worst ratio, and the
   means of padding, balance and the per-cell epoch ratios.

Packed batches: the fewest is a lower bound (bin packing); padding is 1; costs sum(L^2).
Timings are not measured here (see bench/train_time.py): these are plan properties, deterministic.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

DATA = next((d for d in (os.environ.get("REAL_LENGTHS_DIR", ""),
                         os.path.join(ROOT, "..", "shared", "data", "real-lengths"),
                         os.path.join(ROOT, "..", "..", "shared", "data", "real-lengths"))
             if d and os.path.isdir(d)), os.path.join(ROOT, "..", "shared", "data", "real-lengths"))
BASELINE = next((d for d in (os.path.join(ROOT, "..", "baseline"), os.path.join(ROOT, "..", "..", "baseline"))
                 if os.path.isdir(d)), os.path.join(ROOT, "..", "baseline"))
CORPORA = ("librispeech-train-clean-100", "commonvoice-id", "commonvoice-ps", "voicebank-demand")
SHORT = {"librispeech-train-clean-100": "LibriSpeech 100", "commonvoice-id": "CV id", "commonvoice-ps": "CV ps",
         "voicebank-demand": "VoiceBank"}
FPS, CAP = 50, 64
FIT = (0.01729, 2.998e-05, 7.865e-09)  # bench/model.py's step, fitted on CPU (docs/performance.md)
STEP_SHARE = 0.1


def load(name: str) -> np.ndarray:
    return np.ceil(np.load(os.path.join(DATA, name + ".npy")) * FPS).astype(np.int64)


def grids(quick: bool) -> dict[str, list[tuple[str, int, float]]]:
    table = [(c, w, b) for c in CORPORA for w in (8, 64, 512) for b in (0.5, 1.0, 2.0, 4.0)]
    worlds = (1, 4, 16, 64) if quick else (1, 2, 4, 8, 16, 32, 64, 128)
    wide = [(c, w, float(b)) for c in CORPORA for w in worlds
            for b in np.round(np.linspace(0.5, 4.0, 6 if quick else 20), 3)]
    stream = [(c, w, float(b)) for c in CORPORA for w in worlds
              for b in np.round(np.linspace(0.5, 4.0, 3 if quick else 8), 3)]
    return {"table": table, "wide": wide, "stream": stream}


# ------------------------------------------------------------------------------ the child: plan and measure


def measure(steps: list[list[np.ndarray]], lengths: np.ndarray, packed: bool, budget: int) -> dict:
    """Metrics of [step][rank] -> sample index arrays."""
    w = len(steps[0]) if steps else 1
    sizes = np.array([[b.size for b in st] for st in steps], dtype=np.float64).reshape(-1, w)
    longest = np.array([[lengths[b].max() if b.size else 0 for b in st] for st in steps],
                       dtype=np.float64).reshape(-1, w)
    real = np.array([[lengths[b].sum() for b in st] for st in steps], dtype=np.float64).reshape(-1, w)
    sq = np.array([[(lengths[b].astype(np.float64) ** 2).sum() for b in st] for st in steps]).reshape(-1, w)
    tok = real if packed else sizes * longest
    cost = sq if packed else sizes * longest ** 2
    fit = FIT[1] * tok + FIT[2] * cost
    top = cost.max(axis=1) if len(steps) else np.zeros(0)
    bal = np.where(top > 0, cost.sum(axis=1) / (w * np.maximum(top, 1e-300)), 1.0)
    med = max(1, int(np.median(lengths)))
    c0 = STEP_SHARE * max(1, min(CAP, budget // med)) * med * med
    return {"steps": len(steps), "padding": float(real.sum() / tok.sum()) if tok.sum() else 1.0,
            "balance": float(bal.mean()) if len(steps) else 1.0, "epoch_c0": float(top.sum() + c0 * len(steps)),
            "epoch_fit": float(fit.max(axis=1).sum() + FIT[0] * len(steps)) if len(steps) else 0.0}


def shard_counts(n: int, seed: int = 2) -> np.ndarray:
    """bench/affinity.py's shard layout (500-2,000 samples per shard), copied: importing that module imports this
    checkout's plan layer, which the child measuring another tree must not."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(500, 2_000 + 1, size=n // 500 + 1)
    cut = int(np.searchsorted(np.cumsum(sizes), n))
    sizes = sizes[: cut + 1]
    sizes[-1] -= sizes.sum() - n
    return sizes[sizes > 0].astype(np.int64)


def plan_steps(plan) -> list[list[np.ndarray]]:
    w = plan.world_size
    return [[plan.samples[plan.offsets[s * w + r]: plan.offsets[s * w + r + 1]] for r in range(w)]
            for s in plan.step_order.tolist()]


def child(which: str, quick: bool) -> None:
    import streambatch
    from streambatch import make_plan
    try:  # the old layout first: a tree before the plan layer moved has no streambatch.epoch of its own
        from streambatch.streaming.epoch.modes import READ_MODES, iter_windows
        from streambatch.streaming.epoch.windows import WindowConfig
    except ImportError:  # since issue 31: the plan layer
        from streambatch.epoch.read_modes import READ_MODES, iter_windows
        from streambatch.epoch.windows import WindowConfig

    print(f"# {streambatch.__file__}", file=sys.stderr)

    lens = {c: load(c) for c in CORPORA}
    out = []
    g = grids(quick)
    if which in ("table", "wide"):
        for packed in ((False,) if which == "table" else (False, True)):
            for c, w, b in g[which]:
                budget = int(round(b * lens[c].max()))
                p = make_plan(lens[c], budget, CAP, w, planner="bucketed", seed=0, **({"pack": True} if packed else {}))
                out.append({"corpus": c, "w": w, "b": b, "budget": budget, "mode": "packed" if packed else "padded",
                            **measure(plan_steps(p), lens[c], packed, budget)})
    else:
        for mode in ("sample", "shard"):
            for c, w, b in g["stream"]:
                lengths = lens[c]
                budget = int(round(b * lengths.max()))
                counts = shard_counts(lengths.size)
                edges = np.concatenate([[0], np.cumsum(counts)])
                cfg = WindowConfig.build(budget, CAP, w, True, False, 0, "bucketed", {},
                                         window_samples=READ_MODES[mode].default_window(w), read_mode=mode)
                steps = []
                for win in iter_windows(counts, lambda s, x=lengths, e=edges: x[e[s]: e[s + 1]], cfg, 0):
                    gid = edges[win.shard_ids] + win.local
                    steps += [[gid[x] for x in st] for st in plan_steps(win.plan)]
                out.append({"corpus": c, "w": w, "b": b, "budget": budget, "mode": mode,
                            **measure(steps, lengths, False, budget)})
    print(json.dumps(out))


# ------------------------------------------------------------------------------ the parent: compare


def run_tree(tree: str, which: str, quick: bool) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", which] + (["--quick"] if quick else [])
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=os.path.abspath(tree))
    where = [x for x in res.stderr.splitlines() if x.startswith("# ")][-1][2:]
    if not where.startswith(os.path.abspath(tree)):
        raise RuntimeError(f"the child measured {where}, not {tree}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def fewest(rows: list[dict]) -> None:
    from streambatch.core.bounds import step_bound

    lens = {c: load(c) for c in CORPORA}
    for r in rows:
        r["fewest"] = step_bound(lens[r["corpus"]], r["budget"], CAP, r["w"], False, r["mode"] == "packed").steps
        r["ratio"] = r["steps"] / r["fewest"]


def limit(f: int, div: int = 20) -> int:
    return f + f // div + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=BASELINE, help="the tree before (default: ../baseline)")
    ap.add_argument("--quick", action="store_true", help="a smaller wide grid")
    ap.add_argument("--child", choices=("table", "wide", "stream"), help=argparse.SUPPRESS)
    ap.add_argument("--json", metavar="FILE", help="also write every row, before and after")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.quick)
        return
    sys.path.insert(0, ROOT)
    results = {}
    for which in ("table", "wide", "stream"):
        for name, tree in (("before", args.baseline), ("after", ROOT)):
            results[(which, name)] = run_tree(tree, which, args.quick)
            fewest(results[(which, name)])
    before, after = results[("table", "before")], results[("table", "after")]
    print("## Steps against the fewest: bucketed planner (padded), map-style, cap 64\n")
    print("Before -> after. steps / fewest (the limit is 1.05 x fewest + 1); padding, balance; planned epoch "
          "after / before under B*L^2 + c0 (10 % of a full median-length batch per step) and under the fitted "
          "model of bench/model.py.\n")
    print("| corpus | W | budget (x longest) | fewest | steps | steps / fewest | padding | balance "
          "| epoch, B·L² + c0 | epoch, fitted |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for a, b in zip(before, after):
        print(f"| {SHORT[a['corpus']]} | {a['w']} | {a['budget']:,} ({a['b']:g}) | {a['fewest']:,} | "
              f"{a['steps']:,} -> {b['steps']:,} | {a['ratio']:.2f} -> {b['ratio']:.2f} | "
              f"{a['padding']:.3f} -> {b['padding']:.3f} | {a['balance']:.3f} -> {b['balance']:.3f} | "
              f"{b['epoch_c0'] / a['epoch_c0']:.3f} | {b['epoch_fit'] / a['epoch_fit']:.3f} |")
    summary("the table", before, after)
    for which, modes in (("wide", ("padded", "packed")), ("stream", ("sample", "shard"))):
        for mode in modes:
            a = [r for r in results[(which, "before")] if r["mode"] == mode]
            b = [r for r in results[(which, "after")] if r["mode"] == mode]
            summary(f"{'StreamingBatches read_mode=' + repr(mode) if which == 'stream' else mode + ' bucketed'}, "
                    f"{len(a)} plans (W {sorted({r['w'] for r in a})}, {len({r['b'] for r in a})} budgets)", a, b,
                    shard=mode == "shard")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k[0]}/{k[1]}": v for k, v in results.items()}, f)


def summary(title: str, before: list[dict], after: list[dict], shard: bool = False) -> None:
    def over(rows: list[dict], div: int = 20) -> int:
        return sum(r["steps"] > limit(r["fewest"], div) for r in rows)

    print(f"\n### {title}\n")
    print("| | over 1.05 x fewest + 1 | worst steps / fewest | mean padding | mean balance | "
          "epoch B·L² + c0, after / before: max, mean | fitted: max, mean |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rows in (("before", before), ("after", after)):
        ep = [b["epoch_c0"] / a["epoch_c0"] for a, b in zip(before, after)]
        fit = [b["epoch_fit"] / a["epoch_fit"] for a, b in zip(before, after)]
        extra = f" ({over(rows, 10)} over 1.10 x)" if shard else ""
        cells = (f"{max(ep):.3f}, {np.mean(ep):.3f} | {max(fit):.3f}, {np.mean(fit):.3f}" if name == "after"
                 else "- | -")
        print(f"| {name} | {over(rows)} of {len(rows)}{extra} | {max(r['ratio'] for r in rows):.2f} | "
              f"{np.mean([r['padding'] for r in rows]):.4f} | {np.mean([r['balance'] for r in rows]):.4f} | "
              f"{cells} |")
    lower = [(b["padding"] - a["padding"]) for a, b in zip(before, after)]
    longer = sum(b["epoch_c0"] > a["epoch_c0"] * (1 + 1e-9) for a, b in zip(before, after))
    print(f"\nPadding lower than before in {sum(x < -1e-9 for x in lower)} plans (at most by {-min(lower):.4f}); "
          f"the epoch under B·L² + c0 longer in {longer}.")


if __name__ == "__main__":
    main()
