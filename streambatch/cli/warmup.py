"""``streambatch warmup``: compile every kernel into the Numba cache once.

Run it once per environment (an image build, a node's start-up, after
``pip install``) with the ``NUMBA_CACHE_DIR`` every process of the node will
use: later processes then load compiled kernels instead of compiling them.
Example: ``NUMBA_CACHE_DIR=/shared/numba streambatch warmup`` in the image build.
The calls below reach each kernel with the argument types the library passes
(int32 indices below 2**31 samples, np.uint64 keys, int64 lengths; lengths
below and above 2**15), so a tiny input fills the same cache entries as a
large one. Processes that start while it runs wait for it (the node lock of
``core/compile_once.py``) and load what it compiled.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .args import Formatter


def add_parser(sub) -> None:
    p = sub.add_parser("warmup", formatter_class=Formatter, help="compile every kernel into the Numba cache",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quiet", action="store_true",
                   help="print nothing (default: one line, the kernels and signatures warmed)")
    p.set_defaults(run=("warmup", "run_warmup"))


def warm_all() -> None:
    """Call every kernel once with the argument types the library uses."""
    import numpy as np

    from ..core.constraint import BatchLimits
    from ..core.mix import Mix
    from ..core.shuffle import SMALL, permutation_slice
    from ..epoch.interleave import interleave_steps, source_labels
    from ..planners import PLANNERS, make_plan
    from ..planners.shard_affine.planner import warm_up

    lengths = np.arange(1, 301, dtype=np.int64) % 97 + 1
    # Lengths of 2**15 and over (e.g. audio in samples) reach the bucketed kernels as int32, not int16.
    long = lengths.copy()
    long[-1] = 2**15
    for planner in sorted(PLANNERS):
        for shuffle in (True, False):
            for drop_last in (False, True):
                for w in (1, 2):
                    plan = make_plan(lengths, 400, 8, w, shuffle, drop_last, planner=planner)
                    plan.fingerprint()
                    if "pack" in PLANNERS[planner].option_names():  # packed batches: their own kernels
                        make_plan(lengths, 400, 8, w, shuffle, drop_last, planner=planner, pack=True)
            make_plan(long, 400, 8, 2, shuffle, planner=planner)
    mix = Mix.build((150, 150))
    drawn = mix.draw(0, 0, True)
    plan = make_plan(lengths[drawn], 400, 8, 2, planner="greedy")
    interleave_steps(plan, source_labels(mix.source_of(drawn), mix.num_sources), mix.num_sources)
    warm_up(BatchLimits(400, 8), 2)
    warm_up(BatchLimits(400, 8, pack=True), 2)
    permutation_slice(SMALL + 1, 1, 0, 4)  # a large source's cycles (Feistel; small ones shuffle in place)


def kernel_signatures() -> dict[str, int]:
    """Compiled signatures of every loaded streambatch kernel, by name."""
    from numba.core.registry import CPUDispatcher

    out = {}
    for name, module in sorted(sys.modules.items()):
        if name.startswith("streambatch") and module is not None:
            for attr, value in vars(module).items():
                if isinstance(value, CPUDispatcher) and value.__module__ == name:
                    out[f"{name}.{attr}"] = len(value.signatures)
    return out


def run_warmup(args: argparse.Namespace) -> int:
    t = time.process_time()
    warm_all()
    if not args.quiet:
        sigs = kernel_signatures()
        where = os.environ.get("NUMBA_CACHE_DIR") or "__pycache__ beside each kernel module"
        print(f"warmed {len(sigs)} kernels ({sum(sigs.values())} signatures) in {time.process_time() - t:.1f} "
              f"CPU s; cache: {where}")
    return 0
