"""Preflight: the plan's worst batches through the user's step, before training.

An epoch's costliest batch may come hours in. ``run_preflight`` takes the
shapes of every planned batch (``core.limits.BatchShapes``), picks the
costliest (under the memory model when there is one, else under ``B * L``
and ``B * L**2``) and the ones holding the longest clips, runs each shape
once through ``step(batch_size, length)`` with a memory probe
(``memory_probe.py``), and reports the peak and the headroom under the limit
per batch. A batch that runs out of memory or peaks above the limit fails
the preflight, and the report names its shape and the setting that fixes it
(a ``max_batch_tokens`` whose batches fit at that length, or a
``max_length`` that leaves such clips out), found from the memory model or
by searching the largest batch that runs.

It reads the plan and the lengths only: the sampler's (or dataset's) plan,
epoch and resume position are untouched. A packed batch runs as its padded
equivalent (``BatchShapes.padded_equivalent``), which needs at least as much
memory. ``DynamicBatchSampler.preflight`` and ``StreamingBatches.preflight``
call this.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.limits import BatchShapes, LimitCurve
from ..core.memory import MemoryModel, check_margin, parse_bytes
from ..core.memory_fit import largest_batch
from .memory_probe import probe_for


class PreflightError(RuntimeError):
    """A planned batch does not fit; ``report`` holds every batch tried and the fix."""

    def __init__(self, report: PreflightReport):
        super().__init__(report.failure_message())
        self.report = report


@dataclass(frozen=True)
class PreflightRow:
    """One batch tried: where it is (``step``, ``rank``; training order),
    its shape (``count`` x ``max_len``; a packed batch: ``tokens`` too), the
    shape run (``run_batch`` x ``max_len``), why it was picked, the predicted
    and measured peak bytes (None when unknown), ``headroom`` (limit - peak),
    and whether it fitted."""

    step: int
    rank: int
    count: int
    max_len: int
    tokens: int
    run_batch: int
    why: str
    predicted_bytes: float | None
    peak_bytes: int | None
    headroom_bytes: float | None
    oom: bool
    ok: bool
    seconds: float


@dataclass(frozen=True)
class PreflightReport:
    """What the preflight ran: ``rows`` (costliest first), the ``limit_bytes``
    the headroom is measured against (None: only failures count), how memory
    was measured, and for the first failing batch ``fix`` (a sentence) and
    ``largest_fitting`` (the largest batch that ran at its length)."""

    rows: tuple[PreflightRow, ...]
    limit_bytes: float | None
    measured: str
    batches_planned: int
    fix: str | None = None
    largest_fitting: int | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def failed(self) -> list[PreflightRow]:
        return [r for r in self.rows if not r.ok]

    def failure_message(self) -> str:
        bad = self.failed
        if not bad:
            return "preflight: every batch tried fits"
        r = bad[0]
        what = "ran out of memory" if r.oom else (
            f"peaked at {_gib(r.peak_bytes)} GiB, above the limit of {_gib(self.limit_bytes)} GiB")
        return (f"preflight: {len(bad)} of {len(self.rows)} batches tried do not fit; the first, step {r.step} rank "
                f"{r.rank} ({_shape(r)}), {what}. {self.fix or ''}").strip()

    def to_dict(self) -> dict:
        return {"ok": self.ok, "limit_bytes": self.limit_bytes, "measured": self.measured,
                "batches_planned": self.batches_planned, "fix": self.fix, "largest_fitting": self.largest_fitting,
                "rows": [dataclasses.asdict(r) for r in self.rows]}

    def __str__(self) -> str:
        lines = [f"preflight: {len(self.rows)} of {self.batches_planned} planned batches tried "
                 f"({self.measured}{'' if self.limit_bytes is None else f', limit {_gib(self.limit_bytes)} GiB'})",
                 f"  {'step':>6} {'rank':>4} {'shape':>16} {'why':<10} {'predicted':>10} {'peak':>10} "
                 f"{'headroom':>10}  result"]
        for r in self.rows:
            lines.append(f"  {r.step:>6} {r.rank:>4} {_shape(r):>16} {r.why:<10} {_gib(r.predicted_bytes):>10} "
                         f"{_gib(r.peak_bytes):>10} {_gib(r.headroom_bytes):>10}  "
                         f"{'ok' if r.ok else 'OUT OF MEMORY' if r.oom else 'OVER LIMIT'}")
        lines.append(self.failure_message() if not self.ok else "every batch tried fits (GiB above)")
        return "\n".join(lines)


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**30:.3f}"


def _shape(r: PreflightRow) -> str:
    if r.run_batch != r.count:  # packed: tokens, run as its padded equivalent
        return f"{r.tokens} tok/{r.max_len} ({r.run_batch}x)"
    return f"{r.count} x {r.max_len}"


def frontier(count: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Positions of the batches no other batch dominates (as large and as long, one
    of them strictly), one per distinct shape: if these fit, every batch fits
    (memory grows with both). (k,) int64, longest first."""
    if count.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((-count, -length))  # longest first, then largest
    c, L = count[order], length[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = (c[1:] != c[:-1]) | (L[1:] != L[:-1])
    best = np.maximum.accumulate(c)  # the largest count at this length or longer
    keep = first.copy()
    keep[1:] &= c[1:] > best[:-1]  # larger than every batch at least as long before it
    return order[keep]


def select(shapes: BatchShapes, packed: bool, memory: MemoryModel | None, top: int, longest: int
           ) -> list[tuple[int, str]]:
    """Positions (into ``shapes``) of the batches to try and why, costliest
    first: of the shapes no other batch dominates (``frontier``), the ``top``
    costliest (under the memory model, else ``top`` under ``B * L`` and
    ``top`` under ``B * L**2``) and the ``longest`` longest."""
    if len(shapes) == 0:
        return []
    count, length = shapes.padded_equivalent(packed)
    c, L = count.astype(np.float64), length.astype(np.float64)
    if memory is not None:  # what is run: a packed batch as its padded equivalent
        cost = memory.peak(count, length)
        rankings = [("costliest", cost, top)]
    else:  # no model: the batches that lead under either part of a step's memory
        cost = c * L * L
        rankings = [("costliest", c * L, top), ("costliest", cost, top)]
    front = frontier(count, length)  # longest first
    picked: dict[int, str] = {int(i): "longest" for i in front[:longest]}
    for why, score, k in rankings:
        for i in front[np.argsort(-score[front], kind="stable")][:k]:
            picked.setdefault(int(i), why)
    return sorted(picked.items(), key=lambda t: (-cost[t[0]], t[0]))


def run_preflight(shapes: BatchShapes, step: Any, *, packed: bool = False, memory: MemoryModel | str | None = None,
                  limit_bytes: Any = None, top: int = 4, longest: int = 2, device: Any = None,
                  search: bool = True, raise_on_failure: bool = True) -> PreflightReport:
    """Run the worst of ``shapes`` through ``step`` (module docstring).

    step: ``step(batch_size, length)``, a ``FILE.py:FUNC`` script (on a CPU
        each shape then runs in a fresh process: real peaks) or a probe.
    memory: a ``MemoryModel`` or the JSON ``streambatch calibrate --memory``
        wrote: it ranks the batches, predicts their peaks and gives the fix.
    limit_bytes: what a step may use (a size: "20GiB"); default: the
        calibration's ``margin * limit_bytes``, else 90 % of the CUDA device,
        else none (only steps that run out of memory fail).
    top, longest: how many distinct costliest / longest shapes to run.
    search: on a failure without a model, search the largest batch that runs
        at that length (a few more steps) to name the fix.
    raise_on_failure: raise ``PreflightError`` (its ``report`` attached) when
        a batch does not fit; else return the failing report.
    """
    for name, v in (("top", top), ("longest", longest)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a whole number >= 0 of shapes to try, got {v!r}")
    model = MemoryModel.load(memory) if isinstance(memory, (str, os.PathLike)) else memory
    if model is not None and not isinstance(model, MemoryModel):
        raise TypeError(f"memory must be a MemoryModel or a memory JSON file, got {type(model).__name__}")
    probe = probe_for(step, device)
    limit: float | None
    if limit_bytes is not None:
        limit = float(parse_bytes(limit_bytes, "limit_bytes"))
    elif model is not None and model.limit_bytes is not None:
        limit = model.limit_bytes * check_margin(model.margin or 1.0)
    elif getattr(probe, "total_bytes", None):
        limit = 0.9 * probe.total_bytes
    else:
        limit = None
    count, length = shapes.padded_equivalent(packed)
    rows = []
    for i, why in select(shapes, packed, model, top, longest):
        b, L = int(count[i]), int(length[i])
        pred = None if model is None else float(model.peak(b, L))
        m = probe(b, L)
        peak = m.peak_bytes
        ok = not m.oom and (limit is None or peak is None or peak <= limit)
        rows.append(PreflightRow(int(shapes.step[i]), int(shapes.rank[i]), int(shapes.count[i]), L,
                                 int(shapes.sum_len[i]), b, why, pred, peak,
                                 None if limit is None or peak is None else limit - peak, m.oom, ok, m.seconds))
    report = PreflightReport(tuple(rows), limit, probe.measured, len(shapes))
    if report.ok:
        return report
    fix, fitting = _fix(report.failed[0], model, limit, probe, search)
    report = dataclasses.replace(report, fix=fix, largest_fitting=fitting)
    if raise_on_failure:
        raise PreflightError(report)
    return report


def _fix(row: PreflightRow, model: MemoryModel | None, limit: float | None, probe: Any, search: bool
         ) -> tuple[str, int | None]:
    """The sentence naming the setting that fixes ``row``, and the largest batch that fits at its length."""
    L, how = row.max_len, ""
    fitting: int | None = None
    if model is not None and limit is not None:
        fitting, how = int(model.max_batch_size(L, limit)[()]), " by the memory model"
        if fitting >= row.run_batch:  # the model thinks it fits: trust the measurement
            fitting = None
    if fitting is None and search and row.run_batch > 1:
        def fits(b: int) -> bool:
            m = probe(b, L)
            return not m.oom and (limit is None or m.peak_bytes is None or m.peak_bytes <= limit)

        fitting, _, _ = largest_batch(fits, max(1, row.run_batch // 2), row.run_batch - 1, rel_gap=0.1,
                                      max_trials=8)
        how = " (searched)"
    elif fitting is None and row.run_batch == 1:
        fitting = 0
    curve: LimitCurve | None = getattr(model, "limits", None)
    plan_hint = ""
    if curve is not None:
        try:
            tokens, at = curve.budget_within(curve.max_length)
            plan_hint = (f"; the calibrated limit curve holds every length under max_batch_tokens={tokens} "
                         f"(binding at length {at})")
        except ValueError:
            pass
    if fitting is None:
        return (f"Fix: lower max_batch_tokens below {row.run_batch * L} or max_length below {L}; calibrate the "
                f"memory (`streambatch calibrate --memory`) to find the limit{plan_hint}.", None)
    if fitting == 0:
        return (f"Fix: a single sample of length {L} does not fit: set max_length below {L} (long_samples='drop' "
                f"leaves such clips out and counts them) or give the step more memory{plan_hint}.", 0)
    return (f"Fix: max_batch_tokens <= {fitting * L} (the largest batch that fits at length {L} is "
            f"{fitting}{how}), or max_length below {L} to leave such clips out{plan_hint}.", fitting)


def preflight_sampler(sampler: Any, step: Any, **options: Any) -> PreflightReport:
    """``run_preflight`` over a ``DynamicBatchSampler``'s current epoch (its plan and lengths, read only)."""
    shapes = BatchShapes.of_plan(sampler.plan, sampler.lengths, sampler.base_step)
    return run_preflight(shapes, step, packed=sampler.config.limits.pack, **options)
