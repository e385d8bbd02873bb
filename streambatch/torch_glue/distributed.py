"""torch.distributed glue: the world layout, and a check that ranks agree."""

from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..core.validation import check_flag, check_world


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _launcher_env() -> str:
    """'RANK=1, WORLD_SIZE=4' when a launcher (torchrun) set them, else ''."""
    found = [f"{k}={os.environ[k]}" for k in ("RANK", "WORLD_SIZE") if k in os.environ]
    return ", ".join(found)


def resolve_world(rank: Any = None, world_size: Any = None) -> tuple[int, int]:
    """(rank, world_size): given values, else torch.distributed's.

    Explicit values win so that data-parallel ranks under FSDP hybrid sharding
    (or tensor parallelism) can pass their data-parallel rank and size.
    Without an initialised process group, ``None`` means rank 0 of 1 only when
    that is unambiguous: ``rank=None`` with ``world_size > 1``, or both None
    in a process a launcher started as one of several (``WORLD_SIZE > 1``),
    raise instead of silently training every process on rank 0's share.
    """
    if not is_distributed():
        env = _launcher_env()
        launched = os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1")
        if rank is None and (launched and world_size is None or _above_one(world_size)):
            why = (f"the launcher set {env} but torch.distributed is not initialised yet: call "
                   "torch.distributed.init_process_group() before building the sampler or dataset"
                   if env else "torch.distributed is not initialised")
            raise ValueError(
                f"rank=None cannot be resolved with world_size={world_size!r}: {why}; or pass rank= explicitly "
                "(each process its own rank in [0, world_size))")
    if world_size is None:
        world_size = dist.get_world_size() if is_distributed() else 1
    if rank is None:
        rank = dist.get_rank() if is_distributed() else 0
    rank, world_size = check_world(rank, world_size)
    if is_distributed():
        check_fits(world_size)
    return rank, world_size


class _SeedDefault(int):
    """0 or 1 as ``DynamicBatchSampler``'s seed-compatible default of ``rank`` / ``world_size``: the same int
    (and the same signature as the seed sampler's), but known to be a default, not a choice."""

    def __repr__(self) -> str:
        return int.__repr__(self)


SEED_RANK, SEED_WORLD = _SeedDefault(0), _SeedDefault(1)
_said_seed_defaults = False


def warn_seed_defaults(sampler: Any) -> None:
    """Warn, once per process, when a sampler built with the seed sampler's defaults (rank 0 of 1, meant for
    one process) runs in a process group of several: every process would train every sample."""
    global _said_seed_defaults
    if _said_seed_defaults or not is_distributed() or dist.get_world_size() < 2:
        return
    _said_seed_defaults = True
    processes = dist.get_world_size()
    warnings.warn(
        f"{type(sampler).__name__} was built with the seed sampler's defaults rank=0, world_size=1, but "
        f"torch.distributed runs {processes} processes: each of them would train every sample ({processes} times "
        "per epoch in all). Pass rank=None, world_size=None to take them from torch.distributed (or explicit "
        "values); pass world_size=1 yourself if this process alone uses this sampler (evaluation on one rank)",
        RuntimeWarning, stacklevel=3)


FIX = ("pass rank=None, world_size=None to take them from torch.distributed (or, under tensor or pipeline "
       "parallelism, each process's data-parallel rank and size)")


def check_fits(world_size: int) -> None:
    """Raise unless ``world_size`` data-parallel ranks fit the process group: at most as many as there are
    processes, and a divisor of their number (each data-parallel rank shared by the same number of processes,
    as tensor or pipeline parallelism share it). Anything else trains some samples twice and others never."""
    processes = dist.get_world_size()
    if world_size > processes or processes % world_size:
        why = (f"ranks {processes}..{world_size - 1} would have no process, and their samples would never be "
               "trained" if world_size > processes else
               f"{processes} processes cannot share {world_size} ranks evenly, so some samples would be trained "
               "more often than others")
        raise ValueError(f"world_size={world_size} does not fit the {processes} processes of torch.distributed: "
                         f"{why}; {FIX}")


def _above_one(world_size: Any) -> bool:
    try:
        return world_size is not None and int(world_size) > 1
    except (TypeError, ValueError):
        return False  # check_world names the bad value


def _device() -> torch.device:
    # NCCL only reduces CUDA tensors; every other backend takes CPU tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def active(world_size: int) -> bool:
    """Is a cross-rank check possible and meaningful? (A process group of more
    than one rank, and a plan shared by more than one rank: a sampler built
    with world_size=1, e.g. for evaluation on rank 0 only, checks nothing.)"""
    return world_size > 1 and is_distributed() and dist.get_world_size() > 1


def will_check(verify: Any, world_size: Any) -> bool:
    """Will this rank take part in a cross-rank check? Decided from the raw
    arguments, even invalid ones, so that a rank whose arguments fail still
    joins the check that the other ranks make (and then raises with them)."""
    if not is_distributed():
        return False
    try:
        wants = check_flag("verify", verify)
    except TypeError:
        wants = True  # a bad flag: the other ranks presumably check
    return wants and active(guess_world(world_size))


def guess_world(world_size: Any) -> int:
    """The world size a rank will use, even from an invalid argument (then
    the process group's size, which the other ranks most likely use)."""
    if isinstance(world_size, numbers.Integral) and not isinstance(world_size, bool):
        return int(world_size)
    return dist.get_world_size() if is_distributed() else 1


def agree(values: Mapping[str, int], what: str, failure: BaseException | None = None,
          layout: tuple[int, int] | None = None) -> None:
    """Raise on every rank unless all ranks hold the same ``values`` and none failed.

    values: named 63-bit ints (a fingerprint first, then e.g. epoch and step).
    failure: this rank's error, if it could not compute its values; it still
    joins the collective (with a failure marker), so every rank raises at
    once instead of the others waiting for the process-group timeout.
    layout: this process's (rank, world_size) as the caller will use them
    (ignored when ``failure`` is given); passed by every process or by none,
    like every argument that shapes the collective. Every process then also learns every
    other's, and all raise together unless they agree on the world size and
    each rank is claimed by the same number of processes (``check_layout``):
    two processes that both say rank 0 fail on both.

    One all-reduce (max of v and -v for each value, each process's layout in
    its own slots, and the lowest failed rank) tells every rank the range of
    each value; only when a rank failed, a second collective carries its
    message to the others.
    """
    names = list(values)
    me, world = dist.get_rank(), dist.get_world_size()
    vec = [0] * (2 * len(names)) if failure is not None else [x for n in names for x in (values[n], -values[n])]
    if layout is not None:  # slot 2p, 2p + 1: process p's rank + 1 and world size (0: failed, unknown)
        slots = [0] * (2 * world)
        if failure is None:
            slots[2 * me], slots[2 * me + 1] = layout[0] + 1, layout[1]
        vec += slots
    vec.append(-(me if failure is not None else world))  # max over ranks: minus the lowest failed rank
    t = torch.tensor(vec, dtype=torch.int64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    got = t.tolist()
    first_failed = -got[-1]
    if first_failed < world:
        message = [f"{type(failure).__name__}: {failure}" if failure is not None else None]
        dist.broadcast_object_list(message, src=first_failed, device=_device())
        if failure is not None:
            raise failure
        raise ValueError(f"{what} differs across ranks: rank {first_failed} failed before the cross-rank check "
                         f"with {message[0]}; every rank raises so that none waits for it")
    if layout is not None:  # the same verdict on every process: all raise, or none
        start = 2 * len(names)
        check_layout([(got[start + 2 * p] - 1, got[start + 2 * p + 1]) for p in range(world)], what)
    # The fingerprint last: when the epoch or step differs it differs too, and the former says more.
    for i in [*range(1, len(names)), 0]:
        hi, lo, mine = got[2 * i], -got[2 * i + 1], values[names[i]]
        if hi != lo:
            shown = (lambda v: f"{v:#x}") if i == 0 else str
            hint = ("every rank must be given the same lengths, budget, batch-size cap, seed, epoch and world_size"
                    if i == 0 else "every rank must resume from the same checkpoint and call set_epoch alike")
            raise ValueError(f"{what} differs across ranks (rank {me} has {names[i]} {shown(mine)}, others range "
                             f"over [{shown(lo)}, {shown(hi)}]): {hint}")


def check_layout(claims: list[tuple[int, int]], what: str) -> None:
    """Raise unless the (rank, world_size) each process claims, in process order, is a layout that trains every
    sample once: one world size W everywhere, fitting the P processes (``check_fits``), and each rank in
    [0, W) claimed by exactly P / W processes (1 under plain data parallelism)."""
    processes = len(claims)
    worlds = sorted({w for _, w in claims})
    if len(worlds) > 1:
        by = ", ".join(f"process {p}: world_size={w}" for p, (_, w) in enumerate(claims[:8]))
        raise ValueError(f"{what}: the processes were given different world sizes ({by}); {FIX}")
    world = worlds[0]
    check_fits(world)
    share = processes // world
    holders: dict[int, list[int]] = {}
    for p, (r, _) in enumerate(claims):
        holders.setdefault(r, []).append(p)
    wrong = [r for r in range(world) if len(holders.get(r, ())) != share]
    if wrong:
        def who(r: int) -> str:
            ps = holders.get(r, [])
            if not ps:
                return f"rank {r} is claimed by no process"
            names = " and ".join(map(str, ps)) if len(ps) <= 2 else ", ".join(map(str, ps[:6])) + ", ..."
            return f"rank {r} is claimed by process{'es' if len(ps) > 1 else ''} {names}"
        each = "one process each" if share == 1 else f"{share} processes each"
        listed = "; ".join(who(r) for r in wrong[:4]) + ("; ..." if len(wrong) > 4 else "")
        raise ValueError(f"{what}: {listed} (the {processes} processes of torch.distributed must hold ranks "
                         f"0..{world - 1} of world_size={world}, {each}), so some samples would be trained twice "
                         f"and others never; {FIX}")


def check_same_everywhere(fingerprint: int, what: str) -> None:
    """Raise on every rank unless all ranks hold the same 63-bit fingerprint
    (no-op without a process group of more than one rank)."""
    if is_distributed() and dist.get_world_size() > 1:
        agree({"fingerprint": fingerprint}, what)
