"""``streambatch calibrate``: time the user's training step and fit the step cost model planners use;
``--memory``: measure its peak memory, fit the memory model and draw the limit curve (``calibrate_memory.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..torch_glue.step_script import load_step
from .args import Formatter, positive_float, whole
from .calibrate_memory import add_memory_args

__all__ = ["add_parser", "load_step", "run_calibrate"]


def run_calibrate(args: argparse.Namespace) -> int:
    from ..core.cost import CostModel

    if args.memory:
        from .calibrate_memory import run_memory

        return run_memory(args)
    if args.output is None:
        args.output = "cost.json"
    step = load_step(args.script)
    model = CostModel.fit(step, max_batch_tokens=args.max_batch_tokens, max_length=args.max_length,
                          max_batch_size=args.max_batch_size, repeats=args.repeats, warmup=args.warmup,
                          max_seconds=args.max_seconds, progress=sys.stderr.isatty())
    report = model.fit_report
    model.save(args.output, fit=report)
    if args.json:
        print(json.dumps({**model.to_dict(), "fit": report, "output": args.output}))
        return 0
    print(f"timed {report['shapes_timed']} of {report['shapes_designed']} shapes in {report['seconds']:.1f} s "
          f"({report['repeats']} repeats each, medians)")
    print(f"  {'batch':>6} {'length':>7} {'measured s':>11} {'predicted s':>12} {'error':>7}")
    for r in report["shapes"]:
        print(f"  {r['batch_size']:>6} {r['length']:>7} {r['measured_s']:>11.5f} {r['predicted_s']:>12.5f} "
              f"{r['error_pct']:>+6.1f}%")
    print(f"fit: {model}  (median |error| {report['median_abs_error_pct']:.1f}%, "
          f"p90 {report['p90_abs_error_pct']:.1f}%)")
    print(f"wrote {args.output}; plan with it: streambatch plan LENGTHS --planner bucketed -o cost={args.output} ...,"
          f" or DynamicBatchSampler(..., planner='bucketed', cost={args.output!r})")
    return 0


def add_parser(sub: Any) -> None:
    c = sub.add_parser("calibrate", formatter_class=Formatter, help="time your training step and fit its cost model",
                       description=(
        "Time one training step of your model (forward + backward + optimizer) on a designed set of\n"
        "(batch size, length) shapes and fit  seconds = c0 + c1*B*L + c2*B*L^2  (non-negative least\n"
        "squares on relative errors). The JSON it writes is a cost model the bucketed planner,\n"
        "DynamicBatchSampler, StreamingBatches and `streambatch plan -o cost=FILE` accept.\n\n"
        "The script defines a function returning step(batch_size, length), e.g.\n"
        "  def make_step():\n"
        "      model, opt = build()\n"
        "      def step(b, L):\n"
        "          x = torch.randn(b, L, 80); loss = model(x).mean(); loss.backward(); opt.step(); opt.zero_grad()\n"
        "      return step\n\n"
        "--memory measures the step's peak memory instead (CUDA: torch.cuda.max_memory_allocated; CPU: the\n"
        "peak resident memory of a fresh process per shape, the weaker measurement), fits\n"
        "bytes = m0 + m1*B*L + m2*B*L^2, searches the largest batch that fits at a few lengths (as NeMo's\n"
        "OOMptimizer) and writes the model and its limit curve (the largest batch per length) as JSON.\n\n"
        "examples:\n"
        "  streambatch calibrate --script bench/model.py:make_step --max-batch-tokens 16000 --max-length 1500\n"
        "  streambatch calibrate --memory --script bench/model.py:make_step --max-batch-tokens 16000 \\\n"
        "      --max-length 1500 --memory-limit 4GiB"))
    c.add_argument("--script", required=True, metavar="FILE.py:FUNC", help="what builds your step function")
    c.add_argument("--max-batch-tokens", type=whole(1), required=True, metavar="T", help="the budget you plan with")
    c.add_argument("--max-length", type=whole(1), required=True, metavar="L",
                   help="the longest length you train on (frames or tokens, the planner's units)")
    c.add_argument("--max-batch-size", type=whole(1), metavar="B", help="a cap on samples per batch, if any")
    c.add_argument("--repeats", type=whole(1), default=5, metavar="N", help="timed calls per shape (median)")
    c.add_argument("--warmup", type=whole(0), default=2, metavar="N", help="untimed calls of the largest shape first")
    c.add_argument("--max-seconds", type=positive_float, default=300.0, metavar="S",
                   help="bound on the whole timing; shapes left then are dropped")
    c.add_argument("-O", "--output", metavar="FILE.json",
                   help="where the fitted model goes (default: cost.json; memory.json with --memory)")
    c.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    m = c.add_argument_group("memory (--memory: the peak memory of the step instead of its time)")
    add_memory_args(m)
    c.set_defaults(run=("calibrate", "run_calibrate"))
