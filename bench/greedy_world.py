"""The greedy planner across world sizes: speed, cold compile, and plan hashes against another checkout.

    python bench/greedy_world.py speed                       # samples/s at W = 8, 64, 512, 1024; N = 10M, 40M
    python bench/greedy_world.py speed --old /path/to/old    # the same, side by side with another checkout
    python bench/greedy_world.py compile --old /path/to/old  # cold first plan (fresh NUMBA_CACHE_DIR), pairs
    python bench/greedy_world.py hashes --old /path/to/old   # plan hashes on 1,090 configurations, must match

Every measurement runs in a fresh process whose PYTHONPATH is the checkout measured (this one, or ``--old``),
and the two checkouts alternate, so the ratios compare like with like on a busy machine. Times are CPU
seconds (``time.process_time``) of ``make_plan(..., planner="greedy")`` on audio-like lengths
(``streambatch.cli.timing.audio_lengths``: log-normal 0.5-30 s at 50 frames/s; budget 16,000, cap 64),
the median of ``--repeats`` warm runs per process. ``hashes`` exits 1 if any plan differs. Never part of
the test run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's root

# ----------------------------------------------------------------------------------------------- child side


def _child_speed(lengths_path: str, w: int, repeats: int) -> dict:
    import time

    from streambatch import make_plan

    lengths = np.load(lengths_path)
    make_plan(lengths[:1000], 16_000, 64, w)  # load the kernels from the cache
    times = []
    for _ in range(repeats):
        t = time.process_time()
        plan = make_plan(lengths, 16_000, 64, w)
        times.append(time.process_time() - t)
        del plan
    return {"seconds": times}


def _child_compile() -> dict:
    import time

    from streambatch import make_plan
    from streambatch.cli.timing import audio_lengths

    lengths = audio_lengths(2000)
    t = time.process_time()
    make_plan(lengths, 16_000, 64, 8)
    return {"seconds": time.process_time() - t}


def _lengths(kind: str, n: int, rs: np.random.Generator) -> np.ndarray:
    """(n,) int64 lengths of one of the kinds the hash grid covers."""
    if kind == "audio":
        return np.clip(rs.lognormal(np.log(250.0), 0.8, n), 25, 1500).astype(np.int64)
    if kind == "heavy":  # Pareto tail: a few samples far over the budget
        return (20 * (1 + rs.pareto(1.2, n))).astype(np.int64)
    if kind == "constant":  # every key ties: the rotation decides every placement
        return np.full(n, 40, dtype=np.int64)
    if kind == "ties":  # a handful of distinct lengths
        return rs.integers(1, 7, n).astype(np.int64) * 50
    if kind == "zeros":
        return rs.choice(np.array([0, 0, 0, 1, 2]), n).astype(np.int64)
    if kind == "uniform":
        return rs.integers(0, 2000, n).astype(np.int64)
    raise ValueError(kind)


KINDS = ("audio", "heavy", "constant", "ties", "zeros", "uniform")
WORLDS = (1, 2, 3, 5, 7, 8, 16, 17, 31, 32, 63, 64, 100, 128, 255, 256, 333, 500, 511, 512, 513, 777, 1000,
          1023, 1024)
# (budget, cap): cap-bound (the budget never binds), budget-bound (the cap never binds), both, tiny budget
REGIMES = ((10**12, 16), (4_000, 10**9), (16_000, 64), (60, 3))


def configs() -> list[dict]:
    """The hash grid: 1,090 deterministic configurations."""
    out = []
    rs = np.random.default_rng(2024)
    # every world size x kind x regime, N from tiny (W > N) to 200k, shuffle and drop_last varied
    sizes = (0, 1, 37, 700, 5_000, 30_000, 200_000)
    i = 0
    for w in WORLDS:
        for kind in KINDS:
            for budget, cap in REGIMES:
                n = int(sizes[i % len(sizes)])
                if i % 11 == 0:
                    n = max(w - 1, 0)
                out.append(dict(kind=kind, n=n, data_seed=i, max_batch_tokens=budget, max_batch_size=cap,
                                world_size=w, shuffle=i % 5 != 0, drop_last=i % 3 == 0,
                                seed=int(rs.integers(-(2**40), 2**40)), epoch=i % 4))
                i += 1
    # the large cases: N = 1M at the world sizes the issue names
    for w in (8, 64, 333, 512, 1024):
        for kind in KINDS:
            for budget, cap in REGIMES[:3]:
                out.append(dict(kind=kind, n=1_000_000, data_seed=i, max_batch_tokens=budget, max_batch_size=cap,
                                world_size=w, shuffle=True, drop_last=i % 2 == 0, seed=42, epoch=i % 3))
                i += 1
    # random draws of everything, small N: the corners the grid misses
    for _ in range(400):
        w = int(rs.choice([int(rs.integers(1, 17)), int(rs.integers(1, 1025))]))
        out.append(dict(kind=str(rs.choice(KINDS)), n=int(rs.integers(0, 20_000)), data_seed=i,
                        max_batch_tokens=int(rs.choice([rs.integers(1, 600), rs.integers(600, 40_000), 10**12])),
                        max_batch_size=int(rs.choice([rs.integers(1, 5), rs.integers(1, 100), 10**6])),
                        world_size=w, shuffle=bool(rs.integers(0, 2)), drop_last=bool(rs.integers(0, 2)),
                        seed=int(rs.integers(-(2**40), 2**40)), epoch=int(rs.integers(0, 6))))
        i += 1
    return out


def _child_hashes(start: int, stop: int) -> dict:
    from streambatch import make_plan

    result = {}
    for k, c in enumerate(configs()[start:stop], start):
        lengths = _lengths(c["kind"], c["n"], np.random.default_rng(c["data_seed"]))
        p = make_plan(lengths, c["max_batch_tokens"], c["max_batch_size"], c["world_size"], c["shuffle"],
                      c["drop_last"], c["seed"], c["epoch"], planner="greedy")
        h = hashlib.sha256()
        for a in (p.samples, p.offsets, p.step_order, p.leftover if p.leftover is not None else np.zeros(0)):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
            h.update(b"|")
        h.update(f"{p.world_size},{p.num_padded},{p.num_dropped}".encode())
        result[str(k)] = h.hexdigest()
    return result


# ---------------------------------------------------------------------------------------------- parent side


def _run(checkout: str, args: list[str], cache_dir: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=checkout)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "_child", *args], check=True,
                         capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sides(old: str | None) -> list[tuple[str, str]]:
    return [("new", HERE)] + ([("old", os.path.abspath(old))] if old else [])


def speed(ns: list[int], worlds: list[int], repeats: int, old: str | None) -> None:
    from streambatch.cli.timing import audio_lengths

    sides = _sides(old)
    print(f"### Greedy planning speed by world size (audio-like lengths, budget 16,000, cap 64; CPU s, "
          f"median of {repeats} per process)\n")
    head = " | ".join(f"{name} (s) | {name} samples/s" for name, _ in sides)
    extra = " | old time / new time" if old else ""
    print(f"| N | W | {head} | new vs W=64{extra} |")
    print("|---" * (3 + 2 * len(sides) + (1 if old else 0)) + "|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in ns:
            path = os.path.join(tmp, "lengths.npy")
            np.save(path, audio_lengths(n))
            med: dict[int, dict[str, float]] = {}
            for w in worlds:
                med[w] = {}
                for name, checkout in sides:  # alternate the checkouts, one process each
                    r = _run(checkout, ["speed", path, str(w), str(repeats)])
                    med[w][name] = statistics.median(r["seconds"])
                    print(f"  .. {name} N={n:,} W={w}: {[round(s, 2) for s in r['seconds']]}", file=sys.stderr,
                          flush=True)
            for w in worlds:
                m = med[w]
                cells = " | ".join(f"{m[name]:.2f} | {n / m[name] / 1e6:.1f}M" for name, _ in sides)
                # speed relative to W = 64 in the same run: 1.00x is "as fast at W as at 64"
                rel = f"{med[64]['new'] / m['new']:.2f}x" if 64 in med else "-"
                ratio = f" | {m['old'] / m['new']:.2f}x faster" if old else ""
                print(f"| {n:,} | {w} | {cells} | {rel}{ratio} |", flush=True)


def compile_time(pairs: int, old: str | None) -> None:
    sides = _sides(old)
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for name, checkout in sides:
                cache = os.path.join(tmp, f"cache-{name}-{i}")  # empty: every kernel compiles
                times[name].append(_run(checkout, ["compile"], cache_dir=cache)["seconds"])
                print(f"  .. {name} cold: {times[name][-1]:.2f} s", file=sys.stderr, flush=True)
    print("### Greedy cold first plan (fresh NUMBA_CACHE_DIR, 2,000 samples, W=8; CPU s)\n")
    print("| checkout | median (s) | runs (s) |")
    print("|---|---|---|")
    for name, _ in sides:
        print(f"| {name} | {statistics.median(times[name]):.2f} | {', '.join(f'{t:.2f}' for t in times[name])} |")


def hashes(old: str | None) -> int:
    if not old:
        raise SystemExit("hashes needs --old PATH: a checkout whose plans are the reference")
    total = len(configs())
    parts = [(a, min(a + 250, total)) for a in range(0, total, 250)]
    got: dict[str, dict] = {name: {} for name, _ in _sides(old)}
    for a, b in parts:
        for name, checkout in _sides(old):
            got[name].update(_run(checkout, ["hashes", str(a), str(b)]))
        print(f"  .. configurations {a}-{b - 1} of {total}", file=sys.stderr, flush=True)
    cfgs = configs()
    bad = [k for k in got["old"] if got["old"][k] != got["new"][k]]
    for k in bad[:20]:
        print(f"DIFFERENT: {cfgs[int(k)]}")
    big = sum(1 for c in cfgs if c["n"] >= 1_000_000)
    print(f"{total - len(bad)} of {total} configurations plan identically ({big} of them with N = 1M; "
          f"world sizes {min(WORLDS)}-{max(WORLDS)}; kinds {', '.join(KINDS)})")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        what, rest = argv[1], argv[2:]
        if what == "speed":
            r = _child_speed(rest[0], int(rest[1]), int(rest[2]))
        elif what == "compile":
            r = _child_compile()
        else:
            r = _child_hashes(int(rest[0]), int(rest[1]))
        print(json.dumps(r))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("speed", "compile", "hashes"))
    p.add_argument("--old", help="another checkout (its root) to compare with, e.g. a git worktree of main")
    p.add_argument("--n", type=int, nargs="+", default=[10_000_000, 40_000_000])
    p.add_argument("--worlds", type=int, nargs="+", default=[8, 64, 512, 1024])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pairs", type=int, default=3, help="cold compiles per checkout")
    args = p.parse_args(argv)
    if args.what == "speed":
        speed(args.n, args.worlds, args.repeats, args.old)
    elif args.what == "compile":
        compile_time(args.pairs, args.old)
    else:
        return hashes(args.old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
