"""Plan quality on real corpora: padding, balance and planned epoch time.

    python bench/real_corpora.py                       # this tree, ~1 minute
    python bench/real_corpora.py --baseline ../base    # plus "before" columns from another checkout

Needs the shared real length files in ``../shared/data/real-lengths/`` beside
the repository (or ``$REAL_LENGTHS_DIR``, or ``--data DIR``): 1-D float64
``.npy`` arrays of utterance durations in seconds (LibriSpeech train-clean-100, Common Voice Indonesian and Pashto,
VoiceBank-DEMAND; provenance in that folder's SOURCES.md). They are not part of
the repository, so this script is a benchmark only: tests never read them.
``bench/distributions.py``'s four synthetic distributions (N = 20,000 and
200,000) are planned alongside.

Setup (issue 12): seconds -> frames = ceil(s * 50), budget 16,000 frames, at
most 64 per batch, W = 8 and 64, the bucketed planner, seed 0, epochs 0-2
(every figure is the mean over the three epochs).

- padding: real tokens / padded tokens (B x longest), over all batches;
- balance: per step, sum of the W batch costs / (W x the largest), mean over steps;
- time-weighted balance ("tw"): sum of all batch costs / (W x planned epoch time),
  i.e. the same ratio with every step weighted by its time (a slow step with
  idle ranks counts for what it costs, not as one step among many);
- epoch: planned epoch time, the sum over steps of the step's costliest batch
  B * L**2 (a synchronous step lasts as long as its slowest rank), in units of
  1e9 frames**2;
- bound: a lower bound of that time for any plan, max(sum L**2 / W, max L**2)
  (every sample costs at least its own L**2 somewhere, spread over W ranks at
  best; the longest sample alone takes a step);
- top step: the largest share of the epoch time taken by one step.

With ``--baseline DIR`` the same table is computed in a subprocess importing
streambatch from DIR (e.g. a worktree at an older commit), and the before /
after columns and the relative change of the epoch time are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from distributions import DISTRIBUTIONS, make_lengths  # noqa: E402

# The shared folder sits beside the repository (``../shared``); a git worktree
# one level deeper (``wt/NAME``) finds it one level further up.
DATA = next((d for d in (os.environ.get("REAL_LENGTHS_DIR", ""),
                         os.path.join(HERE, "..", "..", "shared", "data", "real-lengths"),
                         os.path.join(HERE, "..", "..", "..", "shared", "data", "real-lengths"))
             if d and os.path.isdir(d)), os.path.join(HERE, "..", "..", "shared", "data", "real-lengths"))
CORPORA = ("librispeech-train-clean-100", "commonvoice-id", "commonvoice-ps", "voicebank-demand")
FPS = 50
BUDGET = 16_000
CAP = 64
WORLDS = (8, 64)
EPOCHS = 3
SEED = 0


def real_lengths(data: str = DATA) -> dict[str, np.ndarray]:
    """name -> (N,) int64 frames (at FPS) of every shared real corpus found in ``data``; a missing one is skipped
    with a note on stderr."""
    out = {}
    for name in CORPORA:
        path = os.path.join(data, f"{name}.npy")
        if os.path.exists(path):
            out[name] = np.ceil(np.load(path) * FPS).astype(np.int64)
        else:
            print(f"  (missing {path}: skipped)", file=sys.stderr)
    return out


def corpus_lengths(data: str) -> dict[str, np.ndarray]:
    """name -> (N,) int64 frames of every corpus found, then the synthetic sets."""
    out = real_lengths(data)
    for name in DISTRIBUTIONS:
        for n in (20_000, 200_000):
            out[f"{name} {n // 1000}k"] = make_lengths(name, n, SEED)
    return out


def plan_metrics(plan, lengths: np.ndarray) -> dict:
    """Metrics of one Plan (only its flat arrays are used, so any version works)."""
    w = plan.world_size
    lens = lengths[plan.samples]
    sizes = np.diff(plan.offsets)
    starts = plan.offsets[:-1]
    longest = np.maximum.reduceat(lens, starts).astype(np.float64)
    real = float(lens.sum())
    cost = (sizes * longest**2).reshape(-1, w)
    step = cost.max(axis=1)
    return {
        "padding": real / float((sizes * longest).sum()),
        "balance": float(np.mean(cost.sum(axis=1) / (w * step))),
        "padding_real": real,
        "padding_padded": float((sizes * longest).sum()),
        "epoch": float(step.sum()),
        "time_balance": float(cost.sum() / (w * step.sum())),
        "top_step": float(step.max() / step.sum()),
        "steps": int(step.size),
    }


def measure(planner: str = "bucketed", data: str = DATA, worlds=WORLDS) -> list[dict]:
    from streambatch import make_plan

    rows = []
    for name, lengths in corpus_lengths(data).items():
        sq = lengths.astype(np.float64) ** 2
        for w in worlds:
            runs = [plan_metrics(make_plan(lengths, BUDGET, CAP, w, seed=SEED, epoch=e, planner=planner), lengths)
                    for e in range(EPOCHS)]
            row = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
            row.update(corpus=name, world_size=w, bound=max(sq.sum() / w, sq.max()))
            rows.append(row)
    return rows


def window_metrics(lengths: np.ndarray, w: int, window_samples: int, shard_size: int = 1000, epoch: int = 0,
                   planner: str = "bucketed") -> dict:
    """``plan_metrics`` of an epoch planned window by window, as
    ``StreamingBatches`` plans it: the lengths cut into shards of
    ``shard_size`` (in corpus order), no tar needed."""
    from streambatch.epoch.read_modes import iter_windows
    from streambatch.epoch.windows import WindowConfig

    bounds = np.arange(0, lengths.size + shard_size, shard_size).clip(max=lengths.size)
    shards = [lengths[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    counts = np.array([x.size for x in shards], dtype=np.int64)
    config = WindowConfig(BUDGET, CAP, w, window_samples, True, False, SEED, planner)
    steps = []
    for win in iter_windows(counts, lambda i: shards[i], config, epoch):
        lens = np.concatenate([shards[s][i:i + 1] for s, i in zip(win.shard_ids, win.local)]) if win.local.size \
            else np.zeros(0, dtype=np.int64)
        steps.append((win.plan, lens))
    parts = [plan_metrics(p, lens) for p, lens in steps if p.num_steps]
    # Merge the windows' figures: sums for time and costs, step-weighted balance.
    n = sum(x["steps"] for x in parts)
    epoch_time = sum(x["epoch"] for x in parts)
    return {
        "padding": sum(x["padding_real"] for x in parts) / sum(x["padding_padded"] for x in parts),
        "balance": sum(x["balance"] * x["steps"] for x in parts) / n,
        "time_balance": sum(x["time_balance"] * x["epoch"] for x in parts) / epoch_time,
        "epoch": epoch_time,
        "steps": n,
    }


def streaming_table(data: str, window_samples: int, worlds=WORLDS) -> str:
    """Whole-corpus plan against window-by-window planning (StreamingBatches)."""
    lines = ["| corpus | W | padding whole / windows | balance whole / windows | tw balance whole / windows "
             "| epoch time windows / whole |", "|---|---|---|---|---|---|"]
    from streambatch import make_plan

    for name, lengths in corpus_lengths(data).items():
        if name not in CORPORA:
            continue
        for w in worlds:
            whole = plan_metrics(make_plan(lengths, BUDGET, CAP, w, seed=SEED, planner="bucketed"), lengths)
            win = window_metrics(lengths, w, window_samples)
            lines.append(f"| {name} | {w} | {whole['padding']:.3f} / {win['padding']:.3f} | "
                         f"{whole['balance']:.3f} / {win['balance']:.3f} | "
                         f"{whole['time_balance']:.3f} / {win['time_balance']:.3f} | "
                         f"{win['epoch'] / whole['epoch']:.3f} |")
    return "\n".join(lines)


def baseline_rows(tree: str, data: str) -> list[dict]:
    """``measure()`` run in a subprocess that imports streambatch from ``tree``."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", "--data", data],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


COLUMNS = (("padding", "padding", "{:.3f}"), ("balance", "balance", "{:.3f}"),
           ("time_balance", "tw balance", "{:.3f}"), ("epoch", "epoch (1e9)", "{:.4g}"))


def _cell(r: dict, key: str, fmt: str) -> str:
    return fmt.format(r[key] / 1e9 if key == "epoch" else r[key])


def table(rows: list[dict], before: list[dict] | None) -> str:
    """A markdown table; with ``before``, "before / after" cells and the epoch time's change."""
    old = {(r["corpus"], r["world_size"]): r for r in before or []}
    head = ["corpus", "W"] + [name + (" before / after" if before else "") for _, name, _ in COLUMNS]
    head += (["change"] if before else []) + ["bound (1e9)", "epoch / bound", "top step"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        b = old.get((r["corpus"], r["world_size"]))
        cells = [r["corpus"], str(r["world_size"])]
        for key, _, fmt in COLUMNS:
            cells.append((_cell(b, key, fmt) + " / " if b else "- / " if before else "") + _cell(r, key, fmt))
        if before:
            cells.append(f"{r['epoch'] / b['epoch'] - 1:+.1%}" if b else "")
        cells += [f"{r['bound'] / 1e9:.4g}", f"{r['epoch'] / r['bound']:.3f}", f"{r['top_step']:.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=DATA, help="folder of the real length files (seconds, .npy)")
    p.add_argument("--baseline", metavar="DIR", help="a checkout to measure the 'before' columns with")
    p.add_argument("--planner", default="bucketed")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--streaming", type=int, metavar="WINDOW_SAMPLES", default=0,
                   help="instead: whole-corpus plans against window-by-window planning with this window size")
    args = p.parse_args(argv)
    if args.streaming:
        print(f"Window by window ({args.streaming:,} samples per window, shards of 1,000 in corpus order) "
              "against the whole corpus at once, bucketed planner, epoch 0\n")
        print(streaming_table(args.data, args.streaming))
        return
    if args.json:
        print(json.dumps(measure(args.planner, args.data)))
        return
    before = baseline_rows(args.baseline, args.data) if args.baseline else None
    rows = measure(args.planner, args.data)
    print(f"Budget {BUDGET:,} frames at {FPS} frames/s, at most {CAP} per batch, planner {args.planner}, "
          f"seed {SEED}, mean of epochs 0-{EPOCHS - 1}\n")
    print(table(rows, before))


if __name__ == "__main__":
    main()
