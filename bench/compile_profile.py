"""Where a cold first plan's compile time goes: per compiled function and per compiler stage.

    python bench/compile_profile.py                      # both planners, 100,000 samples, W = 8
    python bench/compile_profile.py --planner bucketed --sampler --top 40

Each planner runs in a fresh process with an empty NUMBA_CACHE_DIR, so every function the first plan needs
compiles. The child hooks Numba's event API (``numba:compile`` per dispatcher signature, ``numba:run_pass``
per compiler pass) and times the code-generation steps that emit no event (LLVM's function and module
passes, machine-code emission, cache writes), all in CPU seconds (``time.process_time``; compiling is
single-threaded). "self" excludes the compiles of callees nested inside a function's compile: a helper
njit function is compiled (typed, lowered, optimised, emitted) as a library of its own when its first
caller is typed, and its LLVM module is linked again into every caller. ``--sampler`` also times a
``DynamicBatchSampler``'s first epoch (plan + fingerprint), which is what a training process runs. The
figures depend on the machine's load; read the shares. Never part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(planner: str, n: int, sampler: bool) -> dict:
    t_start = time.process_time()
    import numba  # noqa: F401  (timed: a first plan imports it)
    t_numba = time.process_time() - t_start
    import numpy as np
    from numba.core import codegen, dispatcher, event
    from numba.core.caching import Cache

    stages: dict[str, float] = {}
    stack: list[list] = []  # [key, start, child time]
    funcs: dict[str, list[float]] = {}  # key -> [inclusive, self, count]

    def timed(owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                dt = time.process_time() - t
                stages[label] = stages.get(label, 0.0) + dt
                if stack:  # attribute it to the function being compiled
                    per = stack[-1][3]
                    per[label] = per.get(label, 0.0) + dt
        setattr(owner, name, wrapper)

    timed(codegen.CPUCodeLibrary, "_optimize_functions", "llvm: function passes")
    timed(codegen.CPUCodeLibrary, "_optimize_final_module", "llvm: module passes (O3)")
    timed(codegen.JITCodeLibrary, "_finalize_specific", "llvm: machine code (MCJIT)")
    timed(codegen.CPUCodeLibrary, "add_ir_module", "llvm: parse IR + function passes")
    timed(Cache, "save_overload", "cache: save")
    timed(Cache, "load_overload", "cache: load (lookups)")

    class Compiles(event.Listener):
        def on_start(self, ev):
            d = ev.data["dispatcher"]
            seen.append(d)
            key = f"{d.py_func.__module__}.{d.py_func.__qualname__}{tuple(str(a) for a in ev.data['args'])}"
            stack.append([key, time.process_time(), 0.0, {}])

        def on_end(self, ev):
            key, t0, child, per = stack.pop()
            total = time.process_time() - t0
            f = funcs.setdefault(key, [0.0, 0.0, 0, {}])
            f[0] += total
            f[1] += total - child
            f[2] += 1
            for k, v in per.items():
                f[3][k] = f[3].get(k, 0.0) + v
            if stack:
                stack[-1][2] += total

    seen: list = []
    passes: dict[str, float] = {}
    pass_stack: list[list] = []

    class Passes(event.Listener):
        def on_start(self, ev):
            pass_stack.append([ev.data["name"].split(" [")[0], time.process_time(), 0.0])

        def on_end(self, ev):
            name, t0, child = pass_stack.pop()
            total = time.process_time() - t0
            passes[name] = passes.get(name, 0.0) + total - child
            if pass_stack:
                pass_stack[-1][2] += total

    event.register("numba:compile", Compiles())
    event.register("numba:run_pass", Passes())
    _ = dispatcher  # the events come from dispatcher.py
    from streambatch import make_plan
    from streambatch.cli.timing import audio_lengths

    lengths = audio_lengths(n)
    t0 = time.process_time()
    if sampler:
        from streambatch import DynamicBatchSampler

        s = DynamicBatchSampler(lengths, 16_000, 64, rank=0, world_size=8, planner=planner)
        first = next(iter(s))
        assert len(first) > 0
    else:
        make_plan(lengths, 16_000, 64, 8, planner=planner)
    first_plan = time.process_time() - t0
    t1 = time.process_time()
    make_plan(lengths, 16_000, 64, 8, planner=planner)
    second = time.process_time() - t1
    _ = np
    sizes = {}  # optimised LLVM IR lines per compiled signature (helpers included in their callers)
    for d in dict.fromkeys(seen):
        for sig, cres in d.overloads.items():
            key = f"{d.py_func.__module__}.{d.py_func.__qualname__}{tuple(str(a) for a in sig)}"
            sizes[key] = cres.library.get_llvm_str().count("\n")
    for key, f in funcs.items():
        f.append(sizes.get(key, 0))
    return {"numba_import": t_numba, "first": first_plan, "second": second, "stages": stages, "passes": passes,
            "funcs": funcs}


def report(planner: str, r: dict, top: int) -> None:
    funcs = r["funcs"]
    total_compile = sum(f[1] for f in funcs.values())
    print(f"### {planner}: first plan {r['first']:.2f} CPU s (second plan {r['second']:.3f} s); "
          f"numba import {r['numba_import']:.2f} s; {len(funcs)} compiled signatures, {total_compile:.2f} s "
          f"inside numba:compile events\n")
    print("| compiled function (signature) | self s | of which LLVM | inclusive s | optimised IR lines |")
    print("|---|---:|---:|---:|---:|")
    for key, (inc, own, _count, per, lines) in sorted(funcs.items(), key=lambda kv: -kv[1][1])[:top]:
        name = key.replace("streambatch.", "").replace("|", "\\|")
        if len(name) > 110:
            name = name[:107] + "..."
        llvm = sum(v for k, v in per.items() if k.startswith("llvm") and k != "llvm: function passes")
        print(f"| `{name}` | {own:.3f} | {llvm:.3f} | {inc:.3f} | {lines:,} |")
    print("\n| stage | CPU s |")
    print("|---|---:|")
    rows = dict(r["stages"])
    for name, t in sorted(r["passes"].items(), key=lambda kv: -kv[1])[:8]:
        rows[f"numba pass: {name}"] = t
    for name, t in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {t:.2f} |")
    print()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--planner", nargs="*", default=["greedy", "bucketed"])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sampler", action="store_true", help="time a DynamicBatchSampler's first epoch instead")
    ap.add_argument("--root", default=HERE, help="the checkout to profile (default: this one)")
    ap.add_argument("--json", help="also write the raw figures here")
    a = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    raw = {}
    for planner in a.planner:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(a.root), NUMBA_CACHE_DIR=cache)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "_child", planner, str(a.n),
                                  "1" if a.sampler else "0"], check=True, capture_output=True, text=True, env=env,
                                 cwd=os.path.abspath(a.root))
        raw[planner] = json.loads(out.stdout.strip().splitlines()[-1])
        report(planner, raw[planner], a.top)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
