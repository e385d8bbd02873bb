"""Memory-safe batches on a GPU (issue 34): calibrate a transformer ASR encoder's time and memory,
plan an epoch of a real corpus under (a) a token budget tuned on typical clips and (b) the fitted
memory limit, and run drawn steps of each plan, beside the seed's greedy planner and lhotse's
DynamicBucketingSampler, padded and packed.

    bench/gpu_suite.sh LENGTHS_DIR                           # on the GPU machine (well under 8 min on one H200)
    .venv/bin/python bench/gpu_suite.py --lengths-dir ../shared/data/real-lengths --device cpu --quick

LENGTHS_DIR holds ``<corpus>.npy`` arrays of utterance durations in seconds (``../shared/data/real-lengths``);
lengths plan as feature frames at ``--fps`` (100: 10 ms frames). Writes ``gpu_suite.json`` and
``gpu_suite.md`` to ``--out`` (default ``$OUT``).

What runs, in order (each phase records its error and the suite goes on; ``--max-minutes`` bounds the whole):

1. The model: conv subsampling (x4) of 80-dim features, a pre-norm transformer encoder of ``--size``
   (tiny / small / base / large), a log-sum-exp surrogate of the CTC loss (same shapes, cheaper), AdamW;
   bf16 autocast on CUDA. Padded batches attend with ``--attention math`` (explicit softmax(QK^T): memory
   grows with B * L**2, as relative-position attention in ASR encoders does) or ``sdpa``; packed batches
   concatenate their samples and attend per sample, with SDPA over groups of near-equal lengths, and with
   flex attention's document mask when ``torch.nn.attention.flex_attention`` and CUDA are there.
2. Time: ``CostModel.fit`` on the designed shapes. Memory: ``MemoryModel.fit`` with ``CudaProbe``
   (``max_memory_allocated`` after ``reset_peak_memory_stats``; the process limited to ``margin * limit``
   with ``set_per_process_memory_fraction``, so the search meets real out-of-memory errors) or, on a CPU,
   the in-process peak resident memory (weaker); the largest batch is searched at 3 lengths.
3. Plans (``--world-size`` ranks): budget (a) = the curve's batch at the corpus's median length x that
   length ("tuned on typical clips"); (b) = the largest token budget whose padded batches all lie under
   the curve (``LimitCurve.budget_within``), for the planners that cannot take a curve (greedy, the seed's;
   lhotse), while streambatch's bucketed planner, padded and packed, plans (b) under the curve itself (the
   ``limit`` option, the budget not binding). Planners: bucketed, greedy (the seed's), lhotse (when
   importable), bucketed packed ((a): budget (a) in real tokens; (b): the curve).
4. Per plan: batches over the curve in the whole epoch (under the model); ``run_preflight`` of its worst
   batches (padded plans); ``--steps`` drawn steps of rank 0 plus its costliest and longest batch, each
   timed and its peak measured, out-of-memory counted; the epoch estimate: mean drawn step x steps, and
   (padded) the fitted cost model's epoch (slowest rank per step) scaled by measured / predicted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from streambatch import make_plan  # noqa: E402
from streambatch.core.cost import CostModel  # noqa: E402
from streambatch.core.limits import BatchShapes, LimitCurve  # noqa: E402
from streambatch.core.memory import MemoryModel, parse_bytes  # noqa: E402
from streambatch.torch_glue.memory_probe import CudaProbe, InProcessProbe, is_oom, reset_rss_peak, rss_peak  # noqa: E402
from streambatch.torch_glue.preflight import run_preflight  # noqa: E402

FEATURES, VOCAB = 80, 256
SIZES = {"tiny": (64, 4, 2, 128), "small": (144, 4, 4, 576), "base": (512, 8, 12, 2048), "large": (768, 12, 17, 3072)}
CAP = 1024  # samples per batch: the budget, not the cap, decides
DEFAULT_CORPORA = ("librispeech-train-clean-100", "commonvoice-ps")
HEADER = ("| plan | steps | padding eff. | batches over the curve | preflight | drawn steps: OOM | peak GiB "
          "| mean step s "
          "| epoch estimate s | cost-model epoch s |")


# ---------------------------------------------------------------- the model


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x: torch.Tensor, attend: Callable) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(attend(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.n2(x))


class Encoder(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int, ffn: int):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv1d(FEATURES, dim, 3, 2, 1), nn.GELU(), nn.Conv1d(dim, dim, 3, 2, 1), nn.GELU())
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.out = nn.Linear(dim, VOCAB)

    def forward(self, x: torch.Tensor, attend: Callable) -> torch.Tensor:
        """x: (B, T, 80) -> (B, ceil(T / 4), VOCAB) logits."""
        h = self.sub(x.transpose(1, 2)).transpose(1, 2)
        for blk in self.blocks:
            h = blk(h, attend)
        return self.out(h)


def math_attention(mask: torch.Tensor | None) -> Callable:
    def attend(q, k, v):
        s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)  # (B, H, T, T): kept for backward
        if mask is not None:
            s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        return s.softmax(-1) @ v
    return attend


def sdpa_attention(mask: torch.Tensor | None) -> Callable:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None
                                                          else mask[:, None, None, :])


def grouped_sdpa(token_lengths: list[int], device: torch.device) -> Callable:
    """Packed attention with SDPA: samples sorted by length, cut into groups whose longest is <= 1.25 x
    their shortest, each group one padded SDPA call (as varlen kernels do in one)."""
    order = sorted(range(len(token_lengths)), key=lambda i: token_lengths[i])
    starts = np.concatenate([[0], np.cumsum(token_lengths)])
    groups, cur = [], []
    for i in order:
        if cur and token_lengths[i] > 1.25 * token_lengths[cur[0]]:
            groups.append(cur)
            cur = []
        cur.append(i)
    groups.append(cur)
    plans = []
    total = int(starts[-1])
    for g in groups:
        lg = max(token_lengths[i] for i in g)
        idx = np.full((len(g), lg), total, dtype=np.int64)  # `total` points at a zero row appended below
        for r, i in enumerate(g):
            idx[r, : token_lengths[i]] = np.arange(starts[i], starts[i] + token_lengths[i])
        it = torch.as_tensor(idx, device=device)
        plans.append((it, it != total))

    def attend(q, k, v):  # q, k, v: (1, H, T, d)
        out = torch.zeros_like(q)
        pad = q.new_zeros(1, q.shape[1], 1, q.shape[3])
        qp, kp, vp = (torch.cat([a, pad], 2)[0].transpose(0, 1) for a in (q, k, v))  # (T + 1, H, d)
        for it, keep in plans:
            g = [a[it].permute(0, 2, 1, 3) for a in (qp, kp, vp)]  # (G, H, Lg, d)
            o = F.scaled_dot_product_attention(*g, attn_mask=keep[:, None, None, :])
            flat = o.permute(0, 2, 1, 3)[keep]  # (tokens of the group, H, d)
            out[0].transpose(0, 1)[it[keep]] = flat
        return out
    return attend


def flex_attention_fn(token_lengths: list[int], device: torch.device, pad_to: int = 0) -> Callable:
    """Packed attention with flex attention's document mask; the sequence padded to ``pad_to`` tokens (a
    multiple of 1024 at least), so that a plan's batches share one compiled kernel."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    total = sum(token_lengths)
    padded = -(-max(total, pad_to) // 1024) * 1024
    doc = torch.full((padded,), -1, dtype=torch.int32, device=device)
    doc[:total] = torch.repeat_interleave(torch.arange(len(token_lengths), device=device, dtype=torch.int32),
                                          torch.as_tensor(token_lengths, device=device))

    def same_doc(b, h, q, kv):  # a padding token sees only itself: its blocks cost nothing
        return (doc[q] == doc[kv]) & ((doc[q] >= 0) | (q == kv))

    block = create_block_mask(same_doc, None, None, padded, padded, device=device)
    flex = FLEX.setdefault("fn", torch.compile(flex_attention, dynamic=False))

    def attend(q, k, v):
        pad = padded - q.shape[2]
        qp, kp, vp = (F.pad(a, (0, 0, 0, pad)) for a in (q, k, v))
        return flex(qp, kp, vp, block_mask=block)[:, :, : q.shape[2]]
    return attend


FLEX: dict[str, Any] = {}


class Steps:
    """The model's training steps: ``padded(b, L)`` and ``packed(lengths, attention)``."""

    def __init__(self, size: str, attention: str, device: torch.device, seed: int = 0):
        torch.manual_seed(seed)
        self.device, self.attention = device, attention
        self.model = Encoder(*SIZES[size]).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.amp = torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else None
        self.params = sum(p.numel() for p in self.model.parameters())

    def _train(self, x: torch.Tensor, attend: Callable, keep: torch.Tensor | None = None) -> None:
        if self.amp is not None:
            with self.amp:
                logits = self.model(x, attend)
        else:
            logits = self.model(x, attend)
        lse = logits.float().logsumexp(-1)
        loss = lse[keep].mean() if keep is not None else lse.mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def padded(self, b: int, L: int) -> None:
        x = torch.randn(b, L, FEATURES, device=self.device)
        t = -(-L // 4)
        mask = torch.ones(b, t, dtype=torch.bool, device=self.device)
        mask[b // 2 :, t - t // 8 :] = False  # half the batch padded at the end, as a real batch is
        fn = math_attention if self.attention == "math" else sdpa_attention
        self._train(x, fn(mask), mask)

    def packed(self, lengths: list[int], how: str, pad_to: int = 0) -> None:
        tokens = [-(-int(L) // 4) for L in lengths]
        x = torch.randn(1, 4 * sum(tokens), FEATURES, device=self.device)  # each sample in a 4-aligned slot
        attend = (grouped_sdpa(tokens, self.device) if how == "sdpa"
                  else flex_attention_fn(tokens, self.device, pad_to))
        self._train(x, attend)


# ---------------------------------------------------------------- measuring


def measure(device: torch.device, fn: Callable, *args: Any) -> tuple[float | None, int | None, bool]:
    """(seconds, peak bytes, out of memory) of one call."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_rss_peak()
    t0 = time.perf_counter()
    try:
        fn(*args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        if not is_oom(exc):
            raise
        del exc
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return None, None, True
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else rss_peak()
    return seconds, int(peak) if peak is not None else None, False


# ---------------------------------------------------------------- plans


def lhotse_batches(frames: np.ndarray, fps: float, w: int, max_frames: int, seed: int) -> list[list[np.ndarray]] | None:
    """[rank][batch] sample indices from lhotse's DynamicBucketingSampler (each rank's own sampler)."""
    try:
        from lhotse import CutSet, MonoCut
        from lhotse.dataset import DynamicBucketingSampler
    except ImportError:
        return None
    warnings.filterwarnings("ignore", module="lhotse")
    cuts = CutSet.from_cuts(MonoCut(id=str(i), start=0.0, duration=float(x) / fps, channel=0)
                            for i, x in enumerate(frames))
    out = []
    for r in range(w):
        s = DynamicBucketingSampler(cuts, max_duration=max_frames / fps, max_cuts=CAP, num_buckets=30, shuffle=True,
                                    seed=seed, world_size=w, rank=r, drop_last=False)
        s.set_epoch(0)
        out.append([np.array([int(c.id) for c in batch], dtype=np.int64) for batch in s])
    return out


def shapes_of_ranks(per_rank: list[list[np.ndarray]], frames: np.ndarray) -> BatchShapes:
    """BatchShapes of per-rank batch lists (steps: batch i of every rank; ranks may differ in count)."""
    rows = [(i, r, frames[b]) for r, batches in enumerate(per_rank) for i, b in enumerate(batches) if b.size]
    arr = lambda f, dt=np.int64: np.array([f(x) for x in rows], dtype=dt)  # noqa: E731
    return BatchShapes(arr(lambda x: x[0]), arr(lambda x: x[1]), arr(lambda x: x[2].size), arr(lambda x: x[2].max()),
                       arr(lambda x: x[2].sum()), arr(lambda x: float((x[2].astype(float) ** 2).sum()), np.float64),
                       arr(lambda x: x[0]))


def plan_configs(frames: np.ndarray, fps: float, w: int, budget_a: int, budget_b: int, seed: int,
                 flex: bool, curve: LimitCurve | None = None) -> list[dict]:
    """Every plan of the suite: name, kind (padded / packed), per-rank batch lists. (b): streambatch's
    planners take the curve itself (the ``limit`` option: a hard limit per padded length, the token budget
    not binding); the seed's greedy planner and lhotse cannot, and plan under the largest token budget
    within the curve (``LimitCurve.budget_within``, rows marked *)."""
    def ours(budget, planner, **opt):
        plan = make_plan(frames, budget, CAP, w, seed=seed, planner=planner, **opt)
        return [[plan.batch(s, r) for s in range(plan.num_steps)] for r in range(w)]

    unbound = CAP * int(frames.max()) + 1  # a budget that never binds: the curve alone limits (b)
    out = []
    for label, budget in (("(a) budget", budget_a), ("(b) curve", budget_b)):
        if label.startswith("(a)") or curve is None:
            out.append({"name": f"bucketed {label}{'*' if curve is None and budget == budget_b else ''}",
                        "kind": "padded", "budget": budget, "batches": lambda b=budget: ours(b, "bucketed")})
        else:
            out.append({"name": f"bucketed {label}", "kind": "padded", "budget": None,
                        "batches": lambda: ours(unbound, "bucketed", limit=curve)})
        star = "" if label.startswith("(a)") else " budget within curve*"
        out.append({"name": f"greedy (seed) {label[:3]}{star or label[3:]}", "kind": "padded", "budget": budget,
                    "batches": lambda b=budget: ours(b, "greedy")})
        out.append({"name": f"lhotse DynamicBucketing {label[:3]}{star or label[3:]}", "kind": "padded",
                    "budget": budget, "batches": lambda b=budget: lhotse_batches(frames, fps, w, b, seed)})
    packed = [("(a)", budget_a, {})]
    if curve is not None:
        packed.append(("(b) curve", unbound, {"limit": curve}))
    for label, budget, opt in packed:
        out.append({"name": f"bucketed packed, SDPA groups {label}", "kind": "packed", "how": "sdpa",
                    "budget": budget, "batches": lambda b=budget, o=opt: ours(b, "bucketed", pack=True, **o)})
        if flex:
            out.append({"name": f"bucketed packed, flex attention {label}", "kind": "packed", "how": "flex",
                        "budget": budget, "batches": lambda b=budget, o=opt: ours(b, "bucketed", pack=True, **o)})
    return out


# ---------------------------------------------------------------- the suite


def run(args: argparse.Namespace, result: dict) -> None:
    """Fill ``result`` phase by phase (a failure leaves what was measured before it)."""
    t_start = time.perf_counter()
    deadline = t_start + args.max_minutes * 60
    device = torch.device(args.device)
    env = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device),
           "numpy": np.__version__}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    try:
        import lhotse
        import lhotse.dataset  # noqa: F401  # imported before memory is measured: part of the process's base
        env["lhotse"] = lhotse.__version__
    except ImportError:
        env["lhotse"] = None
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
        flex = device.type == "cuda" and not args.no_flex
    except ImportError:
        flex = False
    env["flex_attention"] = flex
    result.update(env=env, errors=[], corpora={})

    corpora = {}
    paths = corpus_paths(args.lengths_dir, args.corpus)
    for path in paths[:1] if args.quick and not args.corpus else paths:  # --quick: one corpus unless named
        seconds = np.load(path).astype(np.float64)
        if args.quick:
            seconds = np.random.default_rng(0).permutation(seconds)[: args.quick_samples]
        frames = np.ceil(seconds * args.fps - 1e-6).astype(np.int64)
        name = os.path.basename(path)[:-4]
        corpora[name] = frames
        result["corpora"][name] = {"samples": int(frames.size), "hours": float(seconds.sum() / 3600),
                                   "median_frames": int(np.median(frames)), "max_frames": int(frames.max())}
    lmax = max(int(f.max()) for f in corpora.values())
    print(f"corpora {result['corpora']} at {args.fps:g} frames/s", flush=True)
    # planners compiled (Numba) before any memory is measured: their code is part of the process's base
    for planner, opt in (("greedy", {}), ("bucketed", {}), ("bucketed", {"pack": True})):
        make_plan(np.arange(1, 200), 400, 16, 2, planner=planner, **opt)

    steps = Steps(args.size, args.attention, device)
    result["model"] = {"size": args.size, "dims": SIZES[args.size], "parameters": steps.params,
                       "attention": args.attention}
    print(f"model {result['model']}", flush=True)

    # memory: limit, probe, fit, curve
    margin = args.margin
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        limit = min(parse_bytes(args.memory_limit), total) if args.memory_limit else total
        probe: Any = CudaProbe(steps.padded, device, memory_fraction=margin * limit / total)
    else:
        reset_rss_peak()
        steps.padded(2, 64)
        extra = (0.25 if args.quick else 0.5) * 2**30
        limit = parse_bytes(args.memory_limit) if args.memory_limit else int(rss_peak() + extra)
        probe = InProcessProbe(steps.padded)
    base, first = probe(1, 16), probe(1, lmax)
    if first.oom:
        raise RuntimeError(f"one clip of {lmax} frames does not fit in {margin:.0%} of {limit / 2**30:.1f} GiB: "
                           "raise --memory-limit or use a smaller --size")
    per = max(first.peak_bytes - base.peak_bytes, 1)  # one clip of the longest length
    design = max(2, int((margin * limit - base.peak_bytes) / per)) * lmax  # designed shapes reach the limit
    t0 = time.perf_counter()
    memory = MemoryModel.fit(probe, max_batch_tokens=design, max_length=lmax, max_batch_size=CAP,
                             lengths=args.lengths, limit_bytes=limit, margin=margin, bisect=args.search,
                             max_seconds=args.fit_seconds)
    curve: LimitCurve = memory.limits
    r = memory.fit_report
    result["memory"] = {"model": memory.to_dict(), "limit_gib": limit / 2**30, "margin": margin,
                        "seconds": time.perf_counter() - t0, "median_abs_error_pct": r["median_abs_error_pct"],
                        "p90_abs_error_pct": r["p90_abs_error_pct"],
                        "max_under_prediction_pct": r["max_under_prediction_pct"],
                        "shapes": r["shapes"], "out_of_memory": r["out_of_memory"], "search": r.get("bisection"),
                        "curve": curve.to_dict()}
    print(f"memory {memory} (median |err| {r['median_abs_error_pct']:.1f}%), {time.perf_counter() - t_start:.0f} s",
          flush=True)

    # time
    t0 = time.perf_counter()
    try:
        cost = CostModel.fit(steps.padded, max_batch_tokens=curve.budget_within(lmax)[0], max_length=lmax,
                             max_batch_size=CAP, repeats=2 if args.quick else 3, warmup=1,
                             max_seconds=args.fit_seconds)
        result["time"] = {"model": cost.to_dict(), "seconds": time.perf_counter() - t0,
                          "median_abs_error_pct": cost.fit_report["median_abs_error_pct"]}
        print(f"time {cost}, {time.perf_counter() - t_start:.0f} s", flush=True)
    except Exception as exc:  # the suite goes on: plans and steps need no time model
        cost = None
        result["errors"].append(f"time fit: {exc!r}")

    rng = np.random.default_rng(args.seed)
    result["plans"] = []
    for name, frames in corpora.items():
        budget_b, binding = curve.budget_within(int(frames.max()))
        median = int(np.median(frames))
        budget_a = int(curve.max_batch_size(median)) * median
        result["corpora"][name].update(budget_a=budget_a, budget_b=budget_b, budget_b_binding_length=binding)
        print(f"{name}: budgets a={budget_a} b={budget_b}", flush=True)
        for cfg in plan_configs(frames, args.fps, args.world_size, budget_a, budget_b, args.seed, flex, curve):
            if time.perf_counter() > deadline:
                result["plans"].append({"corpus": name, "name": cfg["name"], "skipped": "time"})
                continue
            try:
                row = run_config(cfg, frames, steps, probe, memory, curve, cost, device, rng, args)
            except Exception as exc:
                row = {"name": cfg["name"], "error": f"{type(exc).__name__}: {exc}"}
                result["errors"].append(f"{name} / {cfg['name']}: {traceback.format_exc(limit=3)}")
            if row is not None:
                row["corpus"] = name
                result["plans"].append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "drawn"}), flush=True)
    result["seconds"] = time.perf_counter() - t_start


def run_config(cfg: dict, frames: np.ndarray, steps: Steps, probe: Any, memory: MemoryModel, curve: LimitCurve,
               cost: CostModel | None, device: torch.device, rng: np.random.Generator, args) -> dict | None:
    t0 = time.perf_counter()
    per_rank = cfg["batches"]()
    if per_rank is None:
        return None  # lhotse not importable
    plan_s = time.perf_counter() - t0
    packed = cfg["kind"] == "packed"
    shapes = shapes_of_ranks(per_rank, frames)
    n_steps = max(len(b) for b in per_rank)
    row: dict[str, Any] = {"name": cfg["name"], "kind": cfg["kind"], "budget": cfg["budget"], "steps": n_steps,
                           "plan_seconds": plan_s, "samples": int(sum(b.size for rk in per_rank for b in rk))}
    real = float(shapes.sum_len.sum())
    row["padding_efficiency"] = real / float((shapes.count * shapes.max_len).sum())
    if not packed:
        over = curve.check_shapes(shapes).over
        row["batches_over_curve"] = int(over.size)
        row["batches"] = len(shapes)
        pre = run_preflight(shapes, probe, memory=memory, limit_bytes=memory.margin * memory.limit_bytes,
                            top=2, longest=1, search=False, raise_on_failure=False)
        row["preflight"] = {"ok": pre.ok, "tried": len(pre.rows), "failed": len(pre.failed),
                            "worst_peak_gib": max((r.peak_bytes or 0) for r in pre.rows) / 2**30 if pre.rows else None,
                            "fix": pre.fix}
    # drawn steps of rank 0, plus its costliest and its longest batch
    mine = per_rank[0]
    lens0 = [frames[b] for b in mine]
    if packed:
        key = np.array([x.sum() for x in lens0], dtype=np.float64)
    else:
        key = memory.peak([x.size for x in lens0], [x.max() for x in lens0])
    picks = list(dict.fromkeys([int(np.argmax(key)), int(np.argmax([x.max() for x in lens0]))]
                               + rng.choice(len(mine), min(args.steps, len(mine)), replace=False).tolist()))
    warm = lens0[picks[-1]]
    pad_to = max(int((-(-x // 4)).sum()) for x in lens0)  # flex: every batch of the plan in one compiled shape
    run_one = ((lambda x: steps.packed(x.tolist(), cfg["how"], pad_to)) if packed
               else (lambda x: steps.padded(x.size, x.max())))
    measure(device, run_one, warm)  # the config's first call pays for compilation and allocation
    drawn = []
    for i in picks:
        s, peak, oom = measure(device, run_one, lens0[i])
        drawn.append({"step": i, "count": int(lens0[i].size), "max_len": int(lens0[i].max()),
                      "tokens": int(lens0[i].sum()), "seconds": s, "peak_bytes": peak, "oom": oom})
    ok = [d for d in drawn if not d["oom"]]
    row["drawn"] = drawn
    row["drawn_steps"] = len(drawn)
    row["oom"] = sum(d["oom"] for d in drawn)
    row["peak_gib"] = max((d["peak_bytes"] or 0) for d in drawn) / 2**30
    random_ok = [d for d in ok if d["step"] in picks[2:]] or ok
    row["mean_step_s"] = float(np.mean([d["seconds"] for d in random_ok])) if random_ok else None
    row["epoch_estimate_s"] = row["mean_step_s"] * n_steps if row["mean_step_s"] else None
    if cost is not None and not packed and ok:
        # the cost model's epoch (the slowest rank per step), scaled by what the drawn steps measured
        pred = cost.batch_cost(shapes.count, shapes.max_len)
        step_cost = np.zeros(n_steps)
        np.maximum.at(step_cost, shapes.step, pred)
        epoch_pred = float(step_cost.sum() + cost.per_step * n_steps)
        drawn_pred = np.array([cost.batch_cost(d["count"], d["max_len"]) + cost.per_step for d in ok])
        ratio = float(sum(d["seconds"] for d in ok) / drawn_pred.sum())
        row["cost_model_epoch_s"] = epoch_pred * ratio
    return row


def glibc_maps_large_blocks() -> None:
    """On a CPU the peaks are this process's resident memory: have glibc map every block over 128 KiB on
    its own, so freed tensors leave the process and a peak counts what a step holds (as the subprocess
    probe does with MALLOC_MMAP_THRESHOLD_; this is our own benchmark process)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def corpus_paths(folder: str, names: str | None) -> list[str]:
    """The ``.npy`` files of the named corpora (comma-separated; default: LibriSpeech clean-100 and Common
    Voice Pashto, a narrow corpus and a heavy-tailed one, when there; else the first)."""
    have = sorted(f[:-4] for f in os.listdir(folder) if f.endswith(".npy"))
    if not have:
        raise SystemExit(f"{folder} holds no <corpus>.npy")
    want = names.split(",") if names else [n for n in DEFAULT_CORPORA if n in have] or have[:1]
    missing = [n for n in want if n not in have]
    if missing:
        raise SystemExit(f"no {missing} in {folder} (there: {have})")
    return [os.path.join(folder, n + ".npy") for n in want]


def markdown(res: dict) -> str:
    env, m = res.get("env", {}), res.get("memory", {})
    a = res["args"]
    lines = ["# streambatch GPU suite (issue 34)", "",
             f"{env.get('gpu', a['device'])}, torch {env.get('torch')}, lhotse {env.get('lhotse') or 'absent'}, "
             f"flex attention {'yes' if env.get('flex_attention') else 'no'}; {res.get('seconds', 0):.0f} s in all. "
             f"Lengths in frames at {a['fps']:g} frames/s; world size {a['world_size']}.", ""]
    if "model" in res:
        md = res["model"]
        lines += [f"Model {md['size']} ({md['parameters'] / 1e6:.1f} M parameters, {md['attention']} attention "
                  "for padded batches).", ""]
    if m:
        mm = m["model"]
        lines += [f"Memory model ({mm['measured']}): {mm['m0'] / 2**30:.2f} GiB + {mm['m1']:.4g}·B·L + "
                  f"{mm['m2']:.4g}·B·L² bytes; median |error| {m['median_abs_error_pct']:.1f} %, p90 "
                  f"{m['p90_abs_error_pct']:.1f} %, largest under-prediction {m['max_under_prediction_pct']:.1f} %; "
                  f"limit {m['margin']:.0%} of {m['limit_gib']:.1f} GiB.", ""]
        if m.get("search"):
            lines += ["Largest batch searched (as OOMptimizer): " + "; ".join(
                f"L={s['length']}: model {s['model_batch']}, measured {s['largest_fitting']}" for s in m["search"])
                + ".", ""]
    if "time" in res:
        t = res["time"]["model"]
        lines += [f"Time model: {t['c0']:.4g} + {t['c1']:.4g}·B·L + {t['c2']:.4g}·B·L² s.", ""]
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    for name, c in res.get("corpora", {}).items():
        lines += [f"## {name}", "",
                  f"{c['samples']:,} utterances, {c['hours']:.1f} h, median {c['median_frames']} / max "
                  f"{c['max_frames']} frames. Budget (a), tuned on the median clip: {f(c.get('budget_a'), ',')}; "
                  f"(b), under the curve: {f(c.get('budget_b'), ',')} (binding at {c.get('budget_b_binding_length')}).",
                  "", HEADER, "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res.get("plans", []):
            if r.get("corpus") != name:
                continue
            if "error" in r or "skipped" in r:
                lines.append(f"| {r['name']} | {r.get('error') or 'skipped: ' + r['skipped']} |||||||||")
                continue
            pre = r.get("preflight")
            pre_s = "-" if pre is None else ("ok" if pre["ok"] else f"{pre['failed']} of {pre['tried']} fail")
            over = r.get("batches_over_curve")
            over_s = "-" if over is None else f"{over} of {r['batches']}"
            lines.append(f"| {r['name']} | {r['steps']} | {r['padding_efficiency']:.3f} | {over_s} | {pre_s} | "
                         f"{r['oom']} of {r['drawn_steps']} | {r['peak_gib']:.2f} | {f(r['mean_step_s'], '.3f')} | "
                         f"{f(r['epoch_estimate_s'], '.1f')} | {f(r.get('cost_model_epoch_s'), '.1f')} |")
        lines.append("")
    lines += ["(b) rows of streambatch's planners plan under the limit curve itself (the `limit` option: the "
              "largest batch per padded length, a hard limit; the token budget does not bind); rows marked * "
              "(the seed's greedy planner, lhotse) cannot take a curve and plan under the largest token budget "
              "within it (`LimitCurve.budget_within`). "
              "Drawn steps: rank 0's costliest and longest batch and randomly drawn ones; epoch estimate: the mean "
              "of the random ones x steps; cost-model epoch: the fitted time model's slowest rank per step, scaled "
              "by measured / predicted on the drawn steps."]
    if res.get("errors"):
        lines += ["", "Errors:", *[f"- {e.splitlines()[0]}" for e in res["errors"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lengths-dir", required=True, help="folder of <corpus>.npy durations in seconds")
    p.add_argument("--corpus", help="corpora, comma-separated (default: librispeech-train-clean-100,commonvoice-ps)")
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_suite_out"), help="output folder (default: $OUT)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="a subsample of the corpus, a tiny model, few steps")
    p.add_argument("--quick-samples", type=int, default=2000)
    p.add_argument("--size", choices=sorted(SIZES), help="model size (default: base on CUDA, tiny with --quick)")
    p.add_argument("--attention", choices=("math", "sdpa"), default="math", help="padded batches' attention")
    p.add_argument("--no-flex", action="store_true", help="skip the flex attention packed row")
    p.add_argument("--fps", type=float, help="feature frames per second (default: 100; 25 with --quick)")
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--memory-limit", help="memory a step may use, e.g. 40GiB (default: the GPU's; CPU: current + "
                   "0.5 GiB, 0.25 with --quick)")
    p.add_argument("--margin", type=float, default=0.9)
    p.add_argument("--lengths", type=int, default=5, help="designed lengths of the fits")
    p.add_argument("--search", type=int, default=3, help="lengths of the largest-batch search")
    p.add_argument("--steps", type=int, default=8, help="randomly drawn steps timed per plan")
    p.add_argument("--fit-seconds", type=float, default=60.0, help="bound on each fit's designed shapes")
    p.add_argument("--max-minutes", type=float, default=7.0, help="plans left after this are skipped")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.size is None:
        args.size = "tiny" if args.quick or args.device == "cpu" else "base"
    if args.fps is None:
        args.fps = 25.0 if args.quick else 100.0  # --quick: 40 ms frames, so a CPU runs the longest clips fast
    if args.quick:
        args.steps, args.lengths, args.search = min(args.steps, 2), min(args.lengths, 3), min(args.search, 1)
        args.fit_seconds = min(args.fit_seconds, 10.0)
    if args.device == "cpu":
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        glibc_maps_large_blocks()
    os.makedirs(args.out, exist_ok=True)
    res: dict[str, Any] = {"args": vars(args)}
    code = 0
    try:
        run(args, res)
    except Exception:  # what was measured before the failure is still written
        res.setdefault("errors", []).append(traceback.format_exc())
        print(traceback.format_exc(), file=sys.stderr)
        code = 1
    with open(os.path.join(args.out, "gpu_suite.json"), "w") as f:
        json.dump(res, f, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    md = markdown(res)
    with open(os.path.join(args.out, "gpu_suite.md"), "w") as f:
        f.write(md)
    print(md)
    return code


if __name__ == "__main__":
    sys.exit(main())
