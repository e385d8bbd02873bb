"""torch.distributed glue: the world layout, and a check that ranks agree."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..core.validation import check_world


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def resolve_world(rank: Any = None, world_size: Any = None) -> tuple[int, int]:
    """(rank, world_size): given values, else torch.distributed's, else (0, 1).

    Explicit values win so that data-parallel ranks under FSDP hybrid sharding
    (or tensor parallelism) can pass their data-parallel rank and size.
    """
    if world_size is None:
        world_size = dist.get_world_size() if is_distributed() else 1
    if rank is None:
        rank = dist.get_rank() if is_distributed() else 0
    return check_world(rank, world_size)


def _device() -> torch.device:
    # NCCL only reduces CUDA tensors; every other backend takes CPU tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_same_everywhere(fingerprint: int, what: str) -> None:
    """Raise on every rank unless all ranks hold the same 63-bit fingerprint.

    One all-reduce of two int64 (max of x and of -x) tells every rank whether
    the fingerprints agree, so all ranks raise together instead of some
    training on a different plan and then hanging in a collective.
    """
    if not is_distributed() or dist.get_world_size() == 1:
        return
    t = torch.tensor([fingerprint, -fingerprint], dtype=torch.int64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    hi, lo = int(t[0]), -int(t[1])
    if hi != lo:
        raise ValueError(
            f"{what} differs across ranks (rank {dist.get_rank()} has fingerprint {fingerprint:#x}, "
            f"others range over [{lo:#x}, {hi:#x}]): every rank must be given the same lengths, "
            "budget, batch-size cap, seed, epoch and world_size"
        )
