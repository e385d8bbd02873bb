"""Measuring the peak memory of one training step: the probes ``MemoryModel.fit`` and ``preflight`` call.

A probe is ``probe(batch_size, length) -> Measurement`` (peak bytes, or out of
memory), with attributes ``measured`` (how) and ``device``:

- ``CudaProbe``: ``torch.cuda.reset_peak_memory_stats`` then the step, then
  ``torch.cuda.max_memory_allocated``: the tensors' peak on the device, exact
  and cheap. It does not see the CUDA context nor the caching allocator's
  slack (keep a margin: 90 % of the device by default).
- ``SubprocessProbe``: a fresh ``python -m streambatch.torch_glue.memory_probe
  FILE.py:FUNC B L`` per shape, which builds the step, runs it ``repeats``
  times (the optimizer's state exists from the second step on) and reports
  its peak resident memory (``VmHWM``, else ``ru_maxrss``). glibc's malloc
  is told to map every block over 128 KiB on its own
  (``MALLOC_MMAP_THRESHOLD_``, unless set), so a freed tensor leaves the
  process and the peak counts what the step holds at once, not what the
  allocator happened to keep (without it the peak of the same shape varied
  by 15 % and was not monotone in B). The weaker measurement still: it
  counts the interpreter and torch (a few hundred MB, in ``m0``), a training
  process with the default malloc may peak higher (what the margin is for),
  and each shape costs a process start.
- ``InProcessProbe``: the step in this process, its peak resident memory after
  resetting the high-water mark (Linux ``/proc/self/clear_refs``). Weaker
  still: pages the allocator kept from earlier steps count. It is what
  catches a step that raises ``torch.OutOfMemoryError`` (or ``MemoryError``).
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ..core.memory_fit import Measurement
from .step_script import check_spec, load_step

MMAP_THRESHOLD = 128 * 1024  # bytes: larger blocks are mapped alone and unmapped when freed (glibc)
MARK = "STREAMBATCH_MEMORY "  # the child's report line, apart from whatever the user's script prints


def is_oom(exc: BaseException) -> bool:
    """Is this exception a failed allocation (CUDA or host)?"""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def rss_peak() -> int | None:
    """This process's peak resident bytes since start or the last ``reset_rss_peak``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_rss_peak() -> bool:
    """Reset the peak resident memory to the current (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class CudaProbe:
    """Peak of the step's tensors on a CUDA device (``max_memory_allocated``)."""

    measured = "cuda_max_memory_allocated"

    def __init__(self, step: Callable[[int, int], Any], device: Any = None, memory_fraction: float | None = None):
        import torch  # lazy for start-up: only a CUDA probe needs torch.cuda

        self.step, self.torch = step, torch
        self.dev = torch.device(device if device is not None else "cuda")
        if self.dev.type != "cuda" or not torch.cuda.is_available():
            raise ValueError(f"CudaProbe needs a CUDA device, got {device!r} (CUDA available: "
                             f"{torch.cuda.is_available()}); on a CPU use SubprocessProbe or InProcessProbe")
        index = self.dev.index if self.dev.index is not None else torch.cuda.current_device()
        self.dev = torch.device("cuda", index)
        self.device = f"cuda:{index} ({torch.cuda.get_device_name(index)})"
        self.total_bytes = int(torch.cuda.get_device_properties(index).total_memory)
        if memory_fraction is not None:
            # as NeMo's OOMptimizer: allocations past this fraction raise, so the search meets a real boundary
            torch.cuda.set_per_process_memory_fraction(float(memory_fraction), self.dev)

    def __call__(self, batch_size: int, length: int) -> Measurement:
        cuda = self.torch.cuda
        cuda.synchronize(self.dev)
        cuda.reset_peak_memory_stats(self.dev)
        t0 = time.perf_counter()
        try:
            self.step(int(batch_size), int(length))
            cuda.synchronize(self.dev)
        except Exception as exc:
            if not is_oom(exc):
                raise
            del exc
            gc.collect()
            cuda.empty_cache()  # what the failed step left cached, so the next shape starts clean
            return Measurement(None, True, time.perf_counter() - t0)
        return Measurement(int(cuda.max_memory_allocated(self.dev)), False, time.perf_counter() - t0)


class InProcessProbe:
    """The step in this process on the CPU: failures (``OutOfMemoryError``) always,
    the peak resident memory where the high-water mark can be reset (Linux)."""

    measured = "cpu_peak_rss_in_process"
    device = "cpu"

    def __init__(self, step: Callable[[int, int], Any]):
        self.step = step
        self.sees_peak = reset_rss_peak()

    def __call__(self, batch_size: int, length: int) -> Measurement:
        gc.collect(1)  # what the last step left in reference cycles (young): a full collection costs ~0.2 s
        seen = reset_rss_peak()
        t0 = time.perf_counter()
        try:
            self.step(int(batch_size), int(length))
        except Exception as exc:
            if not is_oom(exc):
                raise
            return Measurement(None, True, time.perf_counter() - t0)
        return Measurement(rss_peak() if seen else None, False, time.perf_counter() - t0)


class SubprocessProbe:
    """Peak resident memory of a fresh process per shape running ``FILE.py:FUNC``'s step."""

    measured = "cpu_peak_rss_subprocess"
    device = "cpu"

    def __init__(self, script: str, repeats: int = 2, timeout: float = 600.0, python: str | None = None,
                 env: dict[str, str] | None = None):
        check_spec(script)
        self.script, self.repeats, self.timeout = script, int(repeats), float(timeout)
        self.python = python or sys.executable
        self.env = env

    def __call__(self, batch_size: int, length: int) -> Measurement:
        cmd = [self.python, "-m", __name__, self.script, str(int(batch_size)), str(int(length)), str(self.repeats)]
        env = dict(os.environ if self.env is None else self.env)
        # the child imports this package as the parent does, wherever the parent's copy lives
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout, env=env)
        except subprocess.TimeoutExpired:
            raise ValueError(f"the step of {self.script} on B={batch_size}, L={length} ran past {self.timeout:g} s "
                             "in its measuring process; raise the timeout or measure smaller shapes") from None
        seconds = time.perf_counter() - t0
        report = [line[len(MARK):] for line in done.stdout.splitlines() if line.startswith(MARK)]
        if report:
            got = json.loads(report[-1])
            return Measurement(got["peak_bytes"], bool(got["oom"]), seconds)
        if done.returncode in (-9, 137):  # SIGKILL: the kernel's out-of-memory killer
            return Measurement(None, True, seconds)
        tail = "\n".join((done.stderr or "").strip().splitlines()[-8:])
        raise ValueError(f"measuring {self.script} on B={batch_size}, L={length} failed (exit {done.returncode}):"
                         f"\n{tail}")


def probe_for(step: Any, device: Any = None) -> Any:
    """A probe for ``step``: a probe as is (any callable with a ``measured``
    attribute returning ``Measurement``); ``FILE.py:FUNC`` in a subprocess per
    shape on a CPU (loaded here on CUDA); a callable in this process (CUDA when
    ``device`` is a CUDA device, or None and torch has initialised CUDA)."""
    if isinstance(step, (CudaProbe, InProcessProbe, SubprocessProbe)) or (callable(step) and
                                                                         hasattr(step, "measured")):
        return step  # a probe: its own (an object with ``measured``, returning a Measurement)
    torch = sys.modules.get("torch")
    cuda = (str(device).startswith("cuda") if device is not None
            else torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())
    if isinstance(step, str):
        if not cuda:
            return SubprocessProbe(step)
        step = load_step(step)
    if not callable(step):
        raise TypeError(f"step must be a function step(batch_size, length), a FILE.py:FUNC script or a probe, "
                        f"got {type(step).__name__}")
    return CudaProbe(step, device) if cuda else InProcessProbe(step)


def child(argv: list[str]) -> int:
    """``python -m streambatch.torch_glue.memory_probe FILE.py:FUNC B L REPEATS``: one shape's peak."""
    spec, b, L, repeats = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    step = load_step(spec)
    baseline = rss_peak()
    oom = False
    try:
        for _ in range(max(1, repeats)):
            step(b, L)
    except Exception as exc:
        if not is_oom(exc):
            raise
        oom = True
    print(MARK + json.dumps({"peak_bytes": None if oom else rss_peak(), "baseline_bytes": baseline, "oom": oom}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
