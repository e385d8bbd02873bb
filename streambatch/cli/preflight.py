"""``streambatch preflight``: plan an epoch of your lengths and run its worst batches through your step.

The plan is ``make_plan``'s for the same settings as ``streambatch plan``;
the batches tried, the measurement and the fix are
``torch_glue.preflight.run_preflight``'s. Exit status 1 when a batch does
not fit (the report names the setting that fixes it), 0 when all fit.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .args import Formatter, add_plan_args, length_limit, positive_float, whole
from .calibrate_memory import resolve_device


def run_preflight_cli(args: argparse.Namespace) -> int:
    import numpy as np

    from ..core.config import PlanConfig, check_epoch
    from ..core.limits import BatchShapes
    from ..core.long_samples import too_long
    from ..core.memory import MemoryModel
    from ..planners import plan_epoch
    from ..torch_glue.memory_probe import CudaProbe, InProcessProbe, SubprocessProbe
    from ..torch_glue.preflight import run_preflight
    from ..torch_glue.step_script import check_spec, load_step
    from .plan import load_inputs, resolve_max_length

    check_spec(args.script)
    if not args.inputs:
        raise ValueError("give the lengths to plan (INPUT: a lengths file, manifest or indexed shards)")
    lengths, source, fps = load_inputs(args.inputs, args.field, args.frames_per_second, args.index_dir)
    max_length = resolve_max_length(args.max_length, fps)
    over = too_long(lengths, max_length, "drop")
    kept = np.delete(lengths, over) if over.size else lengths
    config = PlanConfig.build(args.max_batch_tokens, args.max_batch_size, args.world_size, not args.no_shuffle,
                              args.drop_last, args.seed, args.planner, dict(args.planner_option))
    plan = plan_epoch(kept, config, check_epoch(args.epoch))
    packed = config.limits.pack  # the batch rule, resolved once by PlanConfig.build
    memory = MemoryModel.load(args.memory) if args.memory else None
    device = resolve_device(args.device)
    if device.startswith("cuda"):
        probe: Any = CudaProbe(load_step(args.script), device)
    else:
        probe = InProcessProbe(load_step(args.script)) if args.in_process else SubprocessProbe(args.script)
    report = run_preflight(BatchShapes.of_plan(plan, kept), probe, packed=packed, memory=memory,
                           limit_bytes=args.memory_limit, top=args.top, longest=args.longest,
                           raise_on_failure=False)
    if args.json:
        print(json.dumps({"source": source, "too_long": int(over.size), **report.to_dict()}))
    else:
        print(f"{source}: {kept.size:,} samples planned ({int(over.size):,} over max_length left out), "
              f"{plan.num_steps:,} steps x {args.world_size} ranks")
        print(report)
    return 0 if report.ok else 1


def add_parser(sub: Any, planners: list[str], seed_exact: str) -> None:
    p = sub.add_parser("preflight", formatter_class=Formatter,
                       help="run a plan's worst batches through your training step before training",
                       description=(
        "Plan one epoch of your lengths (as `streambatch plan` does) and run its costliest batches\n"
        "(under the memory model of --memory, else under B*L and B*L^2) and the batches holding its\n"
        "longest clips through your step, once each, measuring peak memory: CUDA's\n"
        "max_memory_allocated, or on a CPU the peak resident memory of a fresh process per batch.\n"
        "Reports the headroom under the limit per batch; a batch that runs out of memory or goes over\n"
        "the limit fails with its shape and the setting that fixes it (exit status 1).\n\n"
        "The script is the one `streambatch calibrate` takes: FUNC() returns step(batch_size, length).\n\n"
        "example:\n"
        "  streambatch preflight lengths.npy --script my_step.py:make_step --max-batch-tokens 16000 \\\n"
        "      --planner bucketed --memory memory.json"))
    p.add_argument("inputs", nargs="*", metavar="INPUT", help="lengths file(s), manifest(s) or indexed shards")
    p.add_argument("--script", required=True, metavar="FILE.py:FUNC", help="what builds your step function")
    add_plan_args(p, planners, tokens=None, world=1, planner=seed_exact, seed=42,
                  tokens_help="budget: batch size x longest length (packed: sum of lengths)",
                  world_help="data-parallel world size (every rank's batches are candidates)")
    p.add_argument("--epoch", type=whole(0), default=0, metavar="E", help="epoch to plan")
    p.add_argument("--drop-last", action="store_true", help="drop a partial final step instead of padding it")
    p.add_argument("--no-shuffle", action="store_true", help="plan without shuffling")
    p.add_argument("--field", metavar="NAME", help="JSON field with each sample's length or duration")
    p.add_argument("--frames-per-second", "--fps", type=positive_float, metavar="FPS",
                   help="convert durations in seconds to frames")
    p.add_argument("--index-dir", metavar="DIR", help="where the shards' sidecars are, if not next to the shards")
    p.add_argument("--max-length", type=length_limit, metavar="L",
                   help="leave samples longer than this out (length units, or seconds as 30s)")
    p.add_argument("--memory", metavar="FILE.json", help="a memory model from `streambatch calibrate --memory`")
    p.add_argument("--memory-limit", metavar="SIZE", help="what a step may use, e.g. 8GiB (default: the memory "
                   "file's margin x limit, else 90%% of the CUDA device, else only out-of-memory fails)")
    p.add_argument("--device", metavar="DEV", help="cpu or cuda[:i] (default: cuda when available, else cpu)")
    p.add_argument("--top", type=whole(0), default=4, metavar="N", help="costliest distinct shapes to run")
    p.add_argument("--longest", type=whole(0), default=2, metavar="N", help="longest-clip shapes to run")
    p.add_argument("--in-process", action="store_true",
                   help="CPU: run the batches in this process instead of a fresh process each")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(run=("preflight", "run_preflight_cli"))
