"""Start-up cost (issue 23 items 1 and 2): import and first plan, in whole fresh processes.

    python bench/startup.py                 # import pairs + cold/warm first plan per planner
    python bench/startup.py --pairs 5 --n 100000 --importtime 12
    python bench/startup.py --skip import importtime plan --concurrent 4   # node-wide compile lock on/off

CPU seconds (user + sys of each child, from getrusage), medians of --pairs runs; the
variants are interleaved within each pair so a busy machine loads them alike, and each
import row is also given as its excess over the bare ``import torch`` of the same pairs.
"Cold" is a fresh, empty NUMBA_CACHE_DIR (every kernel compiles); "warm" the same folder
on a second process; "after warmup" a fresh folder filled by ``streambatch warmup`` first.
With ``--old CHECKOUT`` every row is measured on both checkouts, alternating within each pair.
The first plan is split into compile-and-load (first plan minus a second identical plan
in the same process) and run (the second plan).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IMPORTS = {
    "bare python": "pass",
    "import torch": "import torch",
    "import torch, streambatch": "import torch, streambatch",
    "from streambatch import DynamicBatchSampler": "import torch; from streambatch import DynamicBatchSampler",
    "from streambatch import DynamicBatchSampler, StreamingBatches":
        "import torch; from streambatch import DynamicBatchSampler, StreamingBatches",
}

_PLAN = r"""
import json, sys, time
import numpy as np
from streambatch import make_plan
from streambatch.cli.timing import audio_lengths
planner, _, mixed = sys.argv[1].partition("+")
lengths = audio_lengths(int(sys.argv[2]))


def plan():
    if not mixed:
        return make_plan(lengths, 16000, 64, 8, planner=planner)
    # "PLANNER+mix": a mixed epoch - a large source (Feistel order) and a small one (Fisher-Yates)
    # drawn, planned and interleaved
    from streambatch.core.mix import Mix
    from streambatch.epoch.interleave import interleave_steps, source_labels
    mix = Mix.build((lengths.shape[0] - 20_000, 20_000))
    drawn = mix.draw(42, 0)
    p = make_plan(lengths[drawn], 16000, 64, 8, planner=planner)
    return interleave_steps(p, source_labels(mix.source_of(drawn), 2), 2)


c0 = time.process_time()
a = plan()
c1 = time.process_time()
b = plan()
c2 = time.process_time()
assert a.fingerprint() == b.fingerprint()
print(json.dumps({"first": c1 - c0, "second": c2 - c1, "fingerprint": a.fingerprint()}))
"""


# Numba's own floor for a warm first call: import numba and load one small cached kernel (hash_array),
# after the same imports as _PLAN.
_FLOOR = r"""
import json, sys, time
import numpy as np
from streambatch import make_plan  # noqa: F401
from streambatch.cli.timing import audio_lengths  # noqa: F401
c0 = time.process_time()
from streambatch.core.hashing import hash_array
hash_array(np.arange(10), np.int64(1))
print(json.dumps({"first": time.process_time() - c0}))
"""


def child_cpu(args: list[str], env: dict | None = None, root: str = HERE) -> tuple[float, str]:
    """(CPU seconds of the child, its stdout); ``root`` is the checkout it imports."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, *args], check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root, **(env or {})), cwd=root)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out.stdout


def import_table(pairs: int, old: str | None) -> None:
    sides = [("", HERE)] + ([(" (old)", os.path.abspath(old))] if old else [])
    times: dict[str, list[float]] = {}
    for _ in range(pairs):
        for name, code in IMPORTS.items():
            for tag, root in sides:
                if tag and "streambatch" not in name:
                    continue
                times.setdefault(name + tag, []).append(child_cpu(["-c", code], root=root)[0])
    torch = statistics.median(times["import torch"])
    print(f"### Import (whole processes, CPU s, median of {pairs})\n")
    print("| process | CPU s | beyond `import torch` | runs |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        extra = f"{m - torch:+.2f}" if "streambatch" in name else "-"
        label = name.replace(" (old)", "")
        label = f"`{label}`" + (" (old)" if label != name else "")
        print(f"| {label} | {m:.2f} | {extra} | {', '.join(f'{t:.2f}' for t in ts)} |")
    print()


def importtime(top: int) -> None:
    code = "import torch; from streambatch import DynamicBatchSampler, StreamingBatches"
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=HERE), cwd=HERE).stderr
    rows = []
    for line in err.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m and (m.group(4).startswith("streambatch") or m.group(4) in ("numba", "torch", "webdataset")):
            rows.append((int(m.group(2)), int(m.group(1)), m.group(4)))
    rows.sort(reverse=True)
    print(f"### `-X importtime` after `import torch` (top {top}: streambatch modules, numba, torch; wall µs)\n")
    print("| module | cumulative µs | self µs |")
    print("|---|---|---|")
    for cum, own, name in rows[:top]:
        print(f"| {name} | {cum:,} | {own:,} |")
    print(f"\nnumba imported: {'yes' if any(r[2] == 'numba' for r in rows) else 'no'}\n")


def _first_plan(planner: str, n: int, cache: str, root: str) -> tuple[float, float, float]:
    """(whole process, first plan, second plan) CPU seconds of one fresh process."""
    whole, out = child_cpu(["-c", _PLAN, planner, str(n)], {"NUMBA_CACHE_DIR": cache}, root=root)
    r = json.loads(out.strip().splitlines()[-1])
    return whole, r["first"], r["second"]


def plan_table(pairs: int, n: int, planners: list[str], old: str | None, warmup: bool) -> None:
    """Cold (empty cache), warm (second process) and after-warmup first plans, each pair of runs
    interleaving this checkout with ``old`` (if given) so that both see the same load."""
    sides = [("", HERE)] + ([(" (old)", os.path.abspath(old))] if old else [])
    print(f"### First plan, {n:,} samples, W=8 (fresh processes, CPU s, median of {pairs})\n")
    print("| planner | checkout | cache | whole process | first plan | of which compile+load | run (second plan) "
          "| runs (first plan) |")
    print("|---|---|---|---|---|---|---|---|")
    ratio_rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for planner in planners:
            rows: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
            for i in range(pairs):
                if planner == planners[0]:  # Numba's own floor, in the same pairs
                    for kind in ("cold", "warm"):
                        whole, out = child_cpu(["-c", _FLOOR], {"NUMBA_CACHE_DIR": os.path.join(tmp, f"fl{i}")})
                        first = json.loads(out.strip().splitlines()[-1])["first"]
                        rows.setdefault(("floor", kind), []).append((whole, first, 0.0))
                for tag, root in sides:
                    cache = os.path.join(tmp, f"{planner}-{i}{tag.strip(' ()')}")
                    for kind in ("cold", "warm"):
                        rows.setdefault((tag, kind), []).append(_first_plan(planner, n, cache, root))
                    if not warmup:
                        continue
                    warmed = cache + "-w"
                    whole_w, _ = child_cpu(["-m", "streambatch.cli", "warmup"], {"NUMBA_CACHE_DIR": warmed}, root=root)
                    rows.setdefault((tag, "after warmup"), []).append(_first_plan(planner, n, warmed, root))
                    rows.setdefault((tag, "warmup itself"), []).append((whole_w, float("nan"), float("nan")))
            for (tag, kind), rs in rows.items():
                whole, first, second = (statistics.median(x) for x in zip(*rs))
                if tag == "floor":
                    print(f"| Numba's floor: `import numba` + one small cached kernel | - | {kind} | {whole:.2f} | "
                          f"{first:.2f} | - | - | {', '.join(f'{r[1]:.2f}' for r in rs)} |", flush=True)
                    continue
                side = "old" if tag == " (old)" else "this"
                if kind == "warmup itself":
                    print(f"| {planner} | {side} | `streambatch warmup` (all kernels) | {whole:.2f} | - | - | - | - |")
                    continue
                runs = ", ".join(f"{r[1]:.2f}" for r in rs)
                print(f"| {planner} | {side} | {kind} | {whole:.2f} | {first:.2f} | {first - second:.2f} | "
                      f"{second:.2f} | {runs} |", flush=True)
            if old:  # each pair's ratio: both sides of a pair ran back to back, under about the same load
                for kind in ("cold", "warm", "after warmup"):
                    if ("", kind) in rows and (" (old)", kind) in rows:
                        ratios = [a[1] / b[1] for a, b in zip(rows[("", kind)], rows[(" (old)", kind)])]
                        ratio_rows.append(f"| {planner} | {kind} | {statistics.median(ratios):.2f} | "
                                          f"{', '.join(f'{r:.2f}' for r in ratios)} |")
    if ratio_rows:
        print("\n| planner | cache | first plan, this / old (median of the pairs' ratios) | pairs |")
        print("|---|---|---|---|")
        print("\n".join(ratio_rows))
    print()


def concurrent_table(pairs: int, n: int, planners: list[str], procs: int) -> None:
    """``procs`` processes of one node start at once on an empty shared cache (ranks of a job in a fresh
    container): total CPU and wall time until the last has planned, with the node lock of
    ``core/compile_once.py`` and without it (STREAMBATCH_COMPILE_LOCK=0), alternating."""
    import time

    print(f"### {procs} processes at once on an empty shared cache, {n:,} samples, W=8 (CPU s summed over "
          f"the processes, wall s to the last; median of {pairs})\n")
    print("| planner | compile lock | CPU s (all processes) | wall s | first plans (CPU s) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for planner in planners:
            rows: dict[str, list[tuple[float, float, list[float]]]] = {"on": [], "off": []}
            for i in range(pairs):
                for lock in (("on", "off") if i % 2 == 0 else ("off", "on")):
                    env = dict(os.environ, PYTHONPATH=HERE, NUMBA_CACHE_DIR=os.path.join(tmp, f"{planner}{i}{lock}"),
                               STREAMBATCH_COMPILE_LOCK="1" if lock == "on" else "0")
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t = time.perf_counter()
                    ps = [subprocess.Popen([sys.executable, "-c", _PLAN, planner, str(n)], stdout=subprocess.PIPE,
                                           text=True, env=env, cwd=HERE) for _ in range(procs)]
                    outs = [p.communicate()[0] for p in ps]
                    wall = time.perf_counter() - t
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                    firsts = [json.loads(o.strip().splitlines()[-1])["first"] for o in outs]
                    rows[lock].append((cpu, wall, firsts))
            for lock, rs in rows.items():
                cpu = statistics.median(r[0] for r in rs)
                wall = statistics.median(r[1] for r in rs)
                firsts = sorted(rs, key=lambda r: r[0])[len(rs) // 2][2]
                print(f"| {planner} | {lock} | {cpu:.2f} | {wall:.2f} | {', '.join(f'{f:.2f}' for f in firsts)} |",
                      flush=True)
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--importtime", type=int, default=10, help="rows of the -X importtime table")
    ap.add_argument("--planners", nargs="*", default=["greedy", "bucketed"],
                    help="planners to time; PLANNER+mix times a mixed epoch (draw, plan, interleave)")
    ap.add_argument("--old", help="another checkout (e.g. `git archive` of an older commit), interleaved with this one")
    ap.add_argument("--no-warmup", action="store_true", help="skip the after-`streambatch warmup` rows")
    ap.add_argument("--concurrent", type=int, default=0, metavar="K",
                    help="also start K processes at once on an empty cache, with and without the compile lock")
    ap.add_argument("--skip", nargs="*", default=[], choices=["import", "importtime", "plan"])
    a = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    if "import" not in a.skip:
        import_table(a.pairs, a.old)
    if "importtime" not in a.skip:
        importtime(a.importtime)
    if "plan" not in a.skip:
        plan_table(a.pairs, a.n, a.planners, a.old, not a.no_warmup)
    if a.concurrent:
        concurrent_table(a.pairs, a.n, a.planners, a.concurrent)


if __name__ == "__main__":
    main()
