"""Plan hashes of both planners (and the mixing, hashing and shard-affine kernels) against a stored baseline.

    python bench/plan_hashes.py save base.json                # run here, store every hash
    python bench/plan_hashes.py check base.json               # run here, compare: exit 1 on any difference
    python bench/plan_hashes.py compare --old /path/to/old    # run this checkout and another, compare
    python bench/plan_hashes.py check base.json --only greedy # one group (greedy bucketed mix hash affinity)

For changes that must leave plans bit-identical (kernel restructuring for compile time, speed work): save
the hashes from the untouched tree (e.g. ``git archive HEAD | tar -x -C /tmp/base`` and ``save`` with
``--root /tmp/base``), then ``check`` after every change. Each run is a fresh process whose PYTHONPATH is
the checkout measured. Configurations:

- greedy: the 1,090 of ``bench/greedy_world.py`` (W 1-1024; log-normal, Pareto, constant, few-valued, zero
  and uniform lengths; cap- and budget-bound; shuffle and drop_last both ways; N up to 1M);
- bucketed: the same lengths and worlds under every cost model (quadratic, linear, quadratic_duration,
  a fitted step model), with and without ``max_step_cost``, four bucket widths;
- mix: ``Mix.draw`` of small (Fisher-Yates) and large (Feistel) sources, and ``interleave_steps``;
- hash: ``hash_array`` over int8/int16/int32/int64/uint64 arrays and ``Plan.fingerprint``;
- affinity: ``plan_affine_window`` windows (carry, groups, final or not, drop_last);
- packed: the bucketed configurations planned packed (``pack=True``), some under a limit curve, and the
  affinity windows packed.

A configuration that raises records the exception's type and message instead of a hash, so a change in
which inputs are rejected shows too. Never part of the test run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "bench"))

GROUPS = ("greedy", "bucketed", "mix", "hash", "affinity", "packed")


def _digest(*arrays, extra: str = "") -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.zeros(0) if a is None else np.asarray(a)
        h.update(str(a.dtype).encode() + b":")
        h.update(np.ascontiguousarray(a).tobytes())
        h.update(b"|")
    h.update(extra.encode())
    return h.hexdigest()[:32]


def _plan_digest(p) -> str:
    return _digest(p.samples.astype(np.int64), p.offsets, p.step_order, p.leftover,
                   extra=f"{p.world_size},{p.num_padded},{p.num_dropped}")


def _guard(fn, *args, **kwargs) -> str:
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError, OverflowError) as e:
        return f"{type(e).__name__}: {e}"


def _plan_hash(make_plan, lengths: np.ndarray, c: dict, **options) -> str:
    return _plan_digest(make_plan(lengths, c["max_batch_tokens"], c["max_batch_size"], c["world_size"], c["shuffle"],
                                  c["drop_last"], c["seed"], c["epoch"], **options))


def _window_hash(plan_affine_window, *args) -> str:
    aw = plan_affine_window(*args)
    parts = [np.asarray(v) for v in vars(aw).values() if isinstance(v, np.ndarray)]
    plans = [_plan_digest(v) for v in vars(aw).values() if hasattr(v, "offsets")]
    return _digest(*parts, extra=",".join(plans))


# ------------------------------------------------------------------------------------------------ the groups


def greedy_hashes() -> dict[str, str]:
    from greedy_world import _lengths, configs

    from streambatch import make_plan

    out = {}
    for k, c in enumerate(configs()):
        lengths = _lengths(c["kind"], c["n"], np.random.default_rng(c["data_seed"]))
        out[f"greedy/{k}"] = _guard(_plan_hash, make_plan, lengths, c, planner="greedy")
    return out


def _costs():
    from streambatch.core.cost import CostModel

    return ("quadratic", "linear", CostModel.quadratic_duration(1500), CostModel.quadratic_duration(7),
            CostModel.step(0.05, 2e-7, 1e-10), CostModel.step(0.0, 1e-6, 0.0))


def bucketed_configs() -> list[dict]:
    from greedy_world import KINDS, REGIMES, WORLDS

    out = []
    rs = np.random.default_rng(77)
    costs = _costs()
    sizes = (0, 1, 37, 700, 5_000, 30_000, 200_000)
    widths = (0.02, 0.001, 0.1, 1.0)
    i = 0
    for w in WORLDS:
        for kind in KINDS:
            for budget, cap in REGIMES:
                n = int(sizes[i % len(sizes)])
                if i % 13 == 0:
                    n = max(w - 1, 0)
                out.append(dict(kind=kind, n=n, data_seed=1000 + i, max_batch_tokens=budget, max_batch_size=cap,
                                world_size=w, shuffle=i % 5 != 0, drop_last=i % 3 == 0,
                                seed=int(rs.integers(-(2**40), 2**40)), epoch=i % 4, cost=i % len(costs),
                                width=widths[i % 7 % 4], step_cost=i % 4 == 1))
                i += 1
    for w in (8, 64, 512, 1024):
        for kind in KINDS:
            for ci in range(len(costs)):
                out.append(dict(kind=kind, n=1_000_000 if ci < 2 else 100_000, data_seed=1000 + i,
                                max_batch_tokens=16_000, max_batch_size=64, world_size=w, shuffle=True,
                                drop_last=i % 2 == 0, seed=42, epoch=i % 3, cost=ci, width=0.02,
                                step_cost=i % 3 == 0))
                i += 1
    for _ in range(600):
        w = int(rs.choice([int(rs.integers(1, 17)), int(rs.integers(1, 1025))]))
        out.append(dict(kind=str(rs.choice(KINDS)), n=int(rs.integers(0, 20_000)), data_seed=1000 + i,
                        max_batch_tokens=int(rs.choice([rs.integers(1, 600), rs.integers(600, 40_000), 10**9])),
                        max_batch_size=int(rs.choice([rs.integers(1, 5), rs.integers(1, 100), 10**6])),
                        world_size=w, shuffle=bool(rs.integers(0, 2)), drop_last=bool(rs.integers(0, 2)),
                        seed=int(rs.integers(-(2**40), 2**40)), epoch=int(rs.integers(0, 6)),
                        cost=int(rs.integers(0, len(costs))), width=float(rs.choice(widths)),
                        step_cost=bool(rs.integers(0, 3) == 0)))
        i += 1
    return out


def bucketed_hashes() -> dict[str, str]:
    from greedy_world import _lengths

    from streambatch import make_plan
    from streambatch.core.cost import resolve_cost

    costs = _costs()
    out = {}
    for k, c in enumerate(bucketed_configs()):
        lengths = _lengths(c["kind"], c["n"], np.random.default_rng(c["data_seed"]))
        cost = costs[c["cost"]]
        options = dict(cost=cost, bucket_width=c["width"])
        if c["step_cost"]:
            # a cap that binds on the longest samples: a quarter of the costliest full batch
            model = resolve_cost(cost)
            lmax = int(lengths.max(initial=1)) or 1
            full = max(1, min(c["max_batch_size"], c["max_batch_tokens"] // lmax))
            options["max_step_cost"] = float(model.batch_cost(full, lmax)) / 4 or 1.0
        out[f"bucketed/{k}"] = _guard(_plan_hash, make_plan, lengths, c, planner="bucketed", **options)
    return out


def mix_hashes() -> dict[str, str]:
    from streambatch import make_plan
    from streambatch.core.mix import Mix, SourceSpec
    from streambatch.core.shuffle import permutation_slice

    try:
        from streambatch.epoch.interleave import interleave_steps
    except ImportError:  # a checkout from before the plan layer moved (compare --old)
        from streambatch.planners.interleave import interleave_steps

    out = {}
    cases = [((150, 150), None), ((1000, 70_000), None), ((5, 3, 200_000), [SourceSpec(weight=w) for w in (1, 2, 3)]),
             ((40_000, 90_000), [SourceSpec(repeat=2), SourceSpec(samples=1234)])]
    for k, (sizes, specs) in enumerate(cases):
        mix = Mix.build(sizes, specs)
        for seed in (0, 7, -3):
            for epoch in (0, 1, 5):
                for shuffle in (True, False):
                    drawn = mix.draw(seed, epoch, shuffle)
                    out[f"mix/{k}/{seed}/{epoch}/{shuffle}"] = _digest(drawn)
        rs = np.random.default_rng(k)
        lengths = rs.integers(1, 800, size=sum(sizes))
        drawn = mix.draw(1, 0, True)
        sources = mix.source_of(drawn)
        for planner in ("greedy", "bucketed"):
            for w in (1, 4, 64):
                plan = make_plan(lengths[drawn], 8000, 32, w, planner=planner)
                out[f"interleave/{k}/{planner}/{w}"] = _plan_digest(interleave_steps(plan, sources, mix.num_sources))
    for n in (2, 3, 1000, 65_535, 65_536, 65_537, 1 << 20, 10**8 + 7):
        for key in (0, 1, 2**63 + 5, 12345678901234567):
            lo = n // 3
            hi = min(n, lo + 5000)
            out[f"perm/{n}/{key}"] = _digest(permutation_slice(n, key, lo, hi))
    return out


def hash_hashes() -> dict[str, str]:
    from streambatch import make_plan
    from streambatch.core.hashing import hash_array

    out = {}
    rs = np.random.default_rng(5)
    for dtype in (np.int8, np.int16, np.int32, np.int64, np.uint64):
        for n in (0, 1, 1000):
            a = rs.integers(0, 120, size=n).astype(dtype)
            for h in (np.uint64(0), np.uint64(2**64 - 1)):
                out[f"hash/{np.dtype(dtype).name}/{n}/{int(h)}"] = str(int(hash_array(a, h)))
    for planner in ("greedy", "bucketed"):
        for w in (1, 8, 1000):
            plan = make_plan(rs.integers(0, 900, size=50_000), 16_000, 64, w, planner=planner)
            out[f"fingerprint/{planner}/{w}"] = str(plan.fingerprint())
    from streambatch.core.plan import config_fingerprint

    for k in range(20):
        values = [int(v) for v in rs.integers(-(2**62), 2**62, size=k % 5)] + ["abc", "greedy"][: k % 3]
        out[f"hash/config/{k}"] = str(config_fingerprint(rs.integers(0, 10**6, size=k * 37), *values))
    return out


def _affine_window_fn():
    """plan_affine_window(carry, holder, new, max_batch_tokens, max_batch_size, world, shuffle, final, drop_last,
    seed, options, groups), in this checkout's layout (since the plan layer moved: the planner's own signature,
    the options resolved once into the configuration's batch rule)."""
    try:
        from streambatch.core.config import PlanConfig
        from streambatch.planners.shard_affine.planner import plan_affine_window
    except ImportError:  # a checkout from before the plan layer moved (compare --old)
        from streambatch.streaming.epoch.affinity.plan import plan_affine_window

        return plan_affine_window

    def call(carry, holder, new, tokens, size, w, shuffle, final, drop_last, seed, options, groups):
        config = PlanConfig.build(tokens, size, planner="shard_affine", planner_options=options)
        return plan_affine_window(carry, holder, new, config.limits, w, shuffle, final, drop_last, seed,
                                  config.resolved_options["bucket_width"], groups)

    return call


def affinity_hashes() -> dict[str, str]:
    from streambatch.core.cost import CostModel

    plan_affine_window = _affine_window_fn()

    out = {}
    rs = np.random.default_rng(11)
    none = np.zeros(0, dtype=np.int64)
    options = ({}, {"cost": "linear"}, {"cost": CostModel.quadratic_duration(1500)}, {"max_step_cost": 2e9})
    for k in range(120):
        w = int(rs.choice([1, 2, 3, 8, 17, 64]))
        m = int(rs.integers(w, 6000))
        new = np.clip(rs.lognormal(np.log(250.0), 0.8, m), 1, 4000).astype(np.int64)
        if k % 5 == 0:
            new[rs.integers(0, m)] = 16_000  # a pooled outlier
        c = int(rs.integers(0, 50)) if k % 2 else 0
        carry = rs.integers(1, 900, size=c).astype(np.int64) if c else none
        holder = rs.integers(0, w, size=c).astype(np.int64) if c else none
        groups = np.array([0, m // 3, m], dtype=np.int64) if k % 3 == 0 and m > 3 else None
        final = bool(k % 4 == 0)
        opts = dict(options[k % len(options)])
        out[f"affinity/{k}"] = _guard(_window_hash, plan_affine_window, carry, holder, new, 16_000, 64, w,
                                      bool(k % 2), final, bool(k % 8 == 0), int(rs.integers(0, 1000)), opts, groups)
    return out


def packed_hashes() -> dict[str, str]:
    """The bucketed configurations packed (every fourth one also under a limit curve), and the affinity
    windows packed."""
    from greedy_world import _lengths

    from streambatch import make_plan
    from streambatch.core.cost import resolve_cost
    from streambatch.core.limits import LimitCurve

    costs = _costs()
    out = {}
    for k, c in enumerate(bucketed_configs()):
        lengths = _lengths(c["kind"], c["n"], np.random.default_rng(c["data_seed"]))
        cost = costs[c["cost"]]
        options = dict(cost=cost, bucket_width=c["width"], pack=True)
        if c["step_cost"]:
            model = resolve_cost(cost)
            lmax = int(lengths.max(initial=1)) or 1
            options["max_step_cost"] = float(model.packed_cost(np.array([lmax] * 4)).sum()) or 1.0
        out[f"packed/{k}"] = _guard(_plan_hash, make_plan, lengths, c, planner="bucketed", **options)
        if k % 4 == 0:
            lmax = max(8, int(lengths.max(initial=1)))
            curve = LimitCurve.from_table([lmax // 4, lmax // 2, lmax],
                                          [max(1, c["max_batch_size"] // 2), 6, 2])
            out[f"packed_curve/{k}"] = _guard(_plan_hash, make_plan, lengths, c, planner="bucketed", pack=True,
                                              limit=curve)
    plan_affine_window = _affine_window_fn()
    rs = np.random.default_rng(12)
    none = np.zeros(0, dtype=np.int64)
    for k in range(60):
        w = int(rs.choice([1, 2, 3, 8, 17, 64]))
        m = int(rs.integers(w, 6000))
        new = np.clip(rs.lognormal(np.log(250.0), 0.8, m), 1, 4000).astype(np.int64)
        c = int(rs.integers(0, 50)) if k % 2 else 0
        carry = rs.integers(1, 900, size=c).astype(np.int64) if c else none
        holder = rs.integers(0, w, size=c).astype(np.int64) if c else none
        out[f"packed_affinity/{k}"] = _guard(_window_hash, plan_affine_window, carry, holder, new, 16_000, 64, w,
                                             bool(k % 2), bool(k % 4 == 0), bool(k % 8 == 0),
                                             int(rs.integers(0, 1000)), {"pack": True}, None)
    return out


def run_here(groups: list[str]) -> dict[str, str]:
    out = {}
    for g in groups:
        out.update(globals()[f"{g}_hashes"]())
    return out


# ---------------------------------------------------------------------------------------------- parent side


def run_in(root: str, groups: list[str]) -> dict[str, str]:
    """The hashes of the checkout at ``root`` (a fresh process importing it)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "_child", *groups], check=True,
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
          if not bad else "PLANS DIFFER")
    return 1 if bad else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        print(json.dumps(run_here(sys.argv[2:])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["save", "check", "compare"])
    ap.add_argument("file", nargs="?", help="the stored hashes (save, check)")
    ap.add_argument("--old", help="the other checkout (compare)")
    ap.add_argument("--root", default=HERE, help="the checkout to run (default: this one)")
    ap.add_argument("--only", nargs="*", default=list(GROUPS), choices=GROUPS)
    a = ap.parse_args()
    if a.mode == "compare":
        if not a.old:
            ap.error("compare needs --old")
        return diff(run_in(a.old, a.only), run_in(a.root, a.only))
    if not a.file:
        ap.error(f"{a.mode} needs a file")
    new = run_in(a.root, a.only)
    if a.mode == "save":
        with open(a.file, "w") as f:
            json.dump(new, f, indent=0, sort_keys=True)
        print(f"saved {len(new)} hashes to {a.file}")
        return 0
    with open(a.file) as f:
        base = json.load(f)
    return diff({k: v for k, v in base.items() if k.split("/")[0] in _prefixes(a.only)}, new)


def _prefixes(groups: list[str]) -> set[str]:
    names = {"greedy": {"greedy"}, "bucketed": {"bucketed"}, "mix": {"mix", "interleave", "perm"},
             "hash": {"hash", "fingerprint"}, "affinity": {"affinity"},
             "packed": {"packed", "packed_curve", "packed_affinity"}}
    return set().union(*(names[g] for g in groups))


if __name__ == "__main__":
    sys.exit(main())
