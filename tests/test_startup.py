"""Start-up: importing streambatch loads no Numba and no kernel module (issue 23 item 1).

Kernels are imported inside the functions that call them ("lazy for start-up"), so a
process that only imports the package - each rank, each spawned DataLoader worker,
each CLI call - does not pay for Numba. One fresh interpreter checks it, then plans.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kernel_modules() -> list[str]:
    """Every streambatch module whose source defines Numba kernels."""
    found = []
    package = os.path.join(ROOT, "streambatch")
    for folder, _dirs, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    if "njit" in f.read():
                        rel = os.path.relpath(os.path.join(folder, name[:-3]), ROOT)
                        found.append(rel.replace(os.sep, "."))
    return sorted(found)


_CHILD = r"""
import json, sys
kernels = json.loads(sys.argv[1])

def loaded():
    return sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.") and m.count(".") == 1
                  or m in kernels)

out = {}
import streambatch
out["import streambatch"] = loaded()
from streambatch import DynamicBatchSampler, StreamingBatches, make_plan  # noqa: F401
out["from streambatch import DynamicBatchSampler, StreamingBatches"] = loaded()
import numpy as np
lengths = np.random.default_rng(0).integers(1, 500, size=2000)
fps = {}
for planner in ("greedy", "bucketed"):
    plan = make_plan(lengths, 4000, 16, 2, planner=planner)
    fps[planner] = [plan.num_steps, plan.fingerprint(), int(np.sort(plan.samples)[-1])]
out["plans"] = fps
out["after plan"] = "numba" in sys.modules
print(json.dumps(out))
"""


@pytest.mark.slow  # fresh interpreters (subprocesses): the slow tier, with the other subprocess runs
def test_import_loads_no_numba_and_no_kernel_module():
    kernels = kernel_modules()
    assert "streambatch.planners.greedy.placement" in kernels and "streambatch.core.shuffle" in kernels
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(kernels)], capture_output=True, text=True,
                         env=env, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["import streambatch"] == []
    assert out["from streambatch import DynamicBatchSampler, StreamingBatches"] == []
    # ...and the first plan still works (it imports the kernels it needs).
    assert out["after plan"] is True
    import numpy as np

    from streambatch import make_plan

    lengths = np.random.default_rng(0).integers(1, 500, size=2000)
    for planner, (steps, fp, top) in out["plans"].items():
        plan = make_plan(lengths, 4000, 16, 2, planner=planner)
        assert [plan.num_steps, plan.fingerprint(), int(np.sort(plan.samples)[-1])] == [steps, fp, top]


def test_warmup_compiles_every_kernel(capsys):
    from streambatch.cli import main
    from streambatch.cli.warmup import kernel_signatures

    assert main(["warmup"]) == 0
    assert capsys.readouterr().out.startswith("warmed ")
    sigs = kernel_signatures()
    # the kernels each planner, the mixer, the interleaver, hashing and the affinity walker call
    for name in ("streambatch.planners.greedy.placement.greedy_steps", "streambatch.planners.bucketed.steps.plan_steps",
                 "streambatch.planners.bucketed.sort.bucket_sort", "streambatch.core.shuffle.fisher_yates_range",
                 "streambatch.core.hashing.hash_array", "streambatch.core.shuffle.feistel_range",
                 "streambatch.planners.step_order.deficit_order",
                 "streambatch.planners.shard_affine.walk.affine_steps",
                 "streambatch.planners.bucketed.packed_steps.pack_steps",
                 "streambatch.planners.shard_affine.walk.packed_affine_steps"):
        assert sigs.get(name, 0) >= 1, name
