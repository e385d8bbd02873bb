"""``streambatch calibrate --memory``: the peak memory of the user's step, its model and limit curve.

On a CUDA device the step runs in this process under
``torch.cuda.set_per_process_memory_fraction(margin)`` (allocations past the
margin raise, as in NeMo's OOMptimizer) and ``max_memory_allocated`` is read
per shape. On a CPU each shape runs in a fresh process and its peak resident
memory is read (``--in-process``: in this process, resetting the high-water
mark between shapes; faster, weaker). The fit, the search and the curve are
``MemoryModel.fit``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .args import positive_float, whole


def add_memory_args(m: Any) -> None:
    m.add_argument("--memory", action="store_true", help="calibrate the step's peak memory, not its time")
    m.add_argument("--device", metavar="DEV", help="cpu or cuda[:i] (default: cuda when available, else cpu)")
    m.add_argument("--memory-limit", metavar="SIZE",
                   help="memory the step may use, e.g. 8GiB (default on CUDA: the device's memory; required on "
                        "a CPU)")
    m.add_argument("--margin", type=positive_float, default=0.9, metavar="F",
                   help="fraction of the limit batches may use (room for what a step does not show)")
    m.add_argument("--lengths", type=whole(3), default=5, metavar="N", help="designed lengths to measure")
    m.add_argument("--search", type=whole(0), default=3, metavar="N",
                   help="lengths at which to search the largest batch that fits (0: the model alone)")
    m.add_argument("--in-process", action="store_true",
                   help="CPU: measure in this process (resets the peak between shapes) instead of a process "
                        "per shape")


def resolve_device(text: str | None) -> str:
    import torch  # lazy for start-up: --help stays light

    if text is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text != "cpu" and not text.startswith("cuda"):
        raise ValueError(f"--device must be cpu or cuda[:i], got {text!r}")
    if text.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: torch sees no CUDA device; use --device cpu with --memory-limit")
    return text


def make_probe(script: str, device: str, margin: float, in_process: bool) -> Any:
    from ..torch_glue.memory_probe import CudaProbe, InProcessProbe, SubprocessProbe
    from ..torch_glue.step_script import load_step

    if device.startswith("cuda"):
        return CudaProbe(load_step(script), device, memory_fraction=margin)
    return InProcessProbe(load_step(script)) if in_process else SubprocessProbe(script)


def run_memory(args: argparse.Namespace) -> int:
    from ..core.memory import MemoryModel, check_margin, parse_bytes

    margin = check_margin(args.margin)
    device = resolve_device(args.device)
    probe = make_probe(args.script, device, margin, args.in_process)
    if args.memory_limit is not None:
        limit = parse_bytes(args.memory_limit, "--memory-limit")
    elif getattr(probe, "total_bytes", None):
        limit = probe.total_bytes
    else:
        raise ValueError("--memory-limit is required on a CPU (the memory a training process may use, e.g. 8GiB): "
                         "there is no device memory to read")
    output = args.output or "memory.json"
    say = (lambda msg: print(msg, file=sys.stderr)) if sys.stderr.isatty() and not args.json else None
    model = MemoryModel.fit(probe, max_batch_tokens=args.max_batch_tokens, max_length=args.max_length,
                            max_batch_size=args.max_batch_size, lengths=args.lengths, limit_bytes=limit,
                            margin=margin, bisect=args.search, max_seconds=args.max_seconds, progress=say)
    model.save(output)
    report, curve = model.fit_report, model.limits
    tokens, at = curve.budget_within(args.max_length)
    if args.json:
        print(json.dumps({**model.to_dict(), "limit_bytes": limit, "margin": margin, "limits": curve.to_dict(),
                          "fit": report, "budget_within": {"max_batch_tokens": tokens, "binding_length": at},
                          "output": output}))
        return 0
    print(f"measured {report['shapes_measured']} of {report['shapes_designed']} shapes in {report['seconds']:.1f} s "
          f"({model.measured} on {model.device})")
    print(f"  {'batch':>6} {'length':>7} {'peak MiB':>10} {'predicted':>10} {'error':>7}")
    for r in report["shapes"]:
        print(f"  {r['batch_size']:>6} {r['length']:>7} {r['peak_bytes'] / 2**20:>10.1f} "
              f"{r['predicted_bytes'] / 2**20:>10.1f} {r['error_pct']:>+6.1f}%")
    for r in report["out_of_memory"]:
        print(f"  {r['batch_size']:>6} {r['length']:>7} {'out of memory':>10}")
    print(f"fit: {model}  (median |error| {report['median_abs_error_pct']:.1f}%, p90 "
          f"{report['p90_abs_error_pct']:.1f}%, largest under-prediction {report['max_under_prediction_pct']:.1f}%)")
    if report.get("bisection"):
        print(f"largest batch under {margin:.0%} of {limit / 2**30:.3g} GiB:")
        for b in report["bisection"]:
            fail = b["smallest_failing"]
            print(f"  length {b['length']:>7}: model {b['model_batch']:>6}, measured {b['largest_fitting']:>6}"
                  + (f" (fails at {fail})" if fail is not None else " (none failed up to the cap)"))
    print("limit curve: " + ", ".join(f"L<={u}: {b}" for u, b in _sample(curve, args.max_length)))
    print(f"a token budget under it for lengths up to {args.max_length}: max_batch_tokens={tokens} (binding at "
          f"length {at})")
    print(f"wrote {output}; check a plan's worst batches before training: streambatch preflight LENGTHS "
          f"--script {args.script} --max-batch-tokens {tokens} --memory {output}")
    return 0


def _sample(curve: Any, max_length: int, n: int = 6) -> list[tuple[int, int]]:
    """A few (length, batch) points of the curve, spread geometrically up to ``max_length``."""
    import numpy as np

    ls = np.unique(np.geomspace(max(1, max_length / 32), max_length, n).round().astype(np.int64))
    return list(zip(ls.tolist(), curve.max_batch_size(ls).tolist()))
