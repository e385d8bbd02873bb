"""What ``drop_last=True`` leaves out, epoch after epoch, before and after issue 32 item 3 (``planners/tail.py``).

    python bench/drop_last.py [--epochs 5] [--worlds 8 64]

Before: a planner left out everything that could not complete a step (the packed planner its whole partial
final step, which held the shortest clips every epoch). That rule is still what a streamed window whose
leftover is carried into the next one uses (``plan_epoch(..., carry=True)``), so both are measured here in one
process, on the same lengths. Corpora: the real utterance durations of ``../shared/data/real-lengths`` (50
frames/s; skipped when absent) and a synthetic log-normal set; budget 16,000 frames, cap 64 (the README's).
Reported per corpus, planner and W: samples left out per epoch (mean), samples never trained in ``--epochs``
epochs, and steps per epoch (mean).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from real_corpora import real_lengths  # noqa: E402

from streambatch.core.config import PlanConfig  # noqa: E402
from streambatch.planners import plan_epoch  # noqa: E402

BUDGET, CAP, SEED = 16_000, 64, 42
PLANNERS = (("bucketed", {"pack": True}), ("bucketed", {}))  # (shard_affine: its tail is planned by bucketed)


def corpora() -> list[tuple[str, np.ndarray]]:
    """The shared real corpora found (``real_corpora.real_lengths``), then a synthetic log-normal set."""
    rng = np.random.default_rng(0)
    lognormal = np.clip(rng.lognormal(np.log(250), 0.6, 30_000), 20, 1500).astype(np.int64)
    return [*real_lengths().items(), ("log-normal 30k", lognormal)]


def measure(lengths: np.ndarray, config: PlanConfig, epochs: int, carry: bool) -> tuple[float, int, float]:
    """(left out per epoch, never trained in ``epochs`` epochs, steps per epoch)."""
    seen = np.zeros(lengths.shape[0], dtype=bool)
    dropped, steps = [], []
    for e in range(epochs):
        p = plan_epoch(lengths, config, e, carry=carry)
        seen[p.samples] = True
        dropped.append(p.num_dropped)
        steps.append(p.num_steps)
    return float(np.mean(dropped)), int((~seen).sum()), float(np.mean(steps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--worlds", type=int, nargs="+", default=[8, 64])
    args = ap.parse_args()
    print(f"budget {BUDGET:,} frames, cap {CAP}, seed {SEED}, drop_last=True, {args.epochs} epochs\n")
    print("| corpus | samples | planner | W | left out / epoch before | after | never trained before | after "
          "| steps before | after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, lengths in corpora():
        for planner, options in PLANNERS:
            label = planner + (" packed" if options else "")
            for w in args.worlds:
                config = PlanConfig.build(BUDGET, CAP, w, True, True, SEED, planner, options)
                b = measure(lengths, config, args.epochs, carry=True)
                a = measure(lengths, config, args.epochs, carry=False)
                print(f"| {name} | {lengths.size:,} | {label} | {w} | {b[0]:,.1f} | {a[0]:,.1f} | {b[1]:,} | {a[1]:,} "
                      f"| {b[2]:,.1f} | {a[2]:,.1f} |", flush=True)


if __name__ == "__main__":
    main()
