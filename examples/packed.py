"""Padding-free packed batches: plan with ``pack=True``, collate with ``collate_packed``, and keep attention
inside each clip (SDPA with a block-diagonal mask, flex_attention with a document mask, or flash-attn's varlen
kernel on a GPU).

    python examples/packed.py                            # map-style, then streaming from generated shards
    torchrun --nproc-per-node 2 examples/packed.py       # each rank its packed batch of every global step

A packed batch holds clips whose lengths sum to at most ``max_batch_tokens`` (no padding), concatenated along
time: ``features`` (sum T, D) or ``audio`` (1, sum T), with ``cu_seqlens`` (B + 1,) int32 marking where each clip
starts. The first batch's packed attention is checked against attention over each clip on its own.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from streambatch import DynamicBatchSampler, StreamingBatches, collate_packed, index_shards
from streambatch.streaming.formats.packed import block_diagonal_mask, document_ids

from common import FEATURES, clip_lengths, write_shards

HEADS, HEAD_DIM = 4, 16


class Features(Dataset):
    """Item i: a (lengths[i], FEATURES) clip as a sample dict (``collate_packed`` keeps the keys)."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(int(i))
        return {"__key__": f"clip{i}", "features": torch.randn(int(self.lengths[i]), FEATURES, generator=g)}


def sdpa_attention(q, k, v, batch):
    """q, k, v: (sum T, H, d) -> (sum T, H, d), each clip attending only to itself."""
    mask = block_diagonal_mask(batch["cu_seqlens"]).to(q.device)    # (ΣT, ΣT) bool
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], attn_mask=mask)
    return out[0].transpose(0, 1)


def flex_attention_packed(q, k, v, batch):
    """The same with PyTorch's flex_attention and a document mask (no (ΣT, ΣT) mask in memory)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = document_ids(batch["cu_seqlens"]).to(q.device)           # (ΣT,)

    def same_sample(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]
    total = doc.shape[0]
    block_mask = create_block_mask(same_sample, None, None, total, total, device=q.device)
    out = flex_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                         block_mask=block_mask)                   # (1, H, ΣT, d)
    return out[0].transpose(0, 1)


def flash_attention(q, k, v, batch):
    """The same with flash-attn's varlen kernel (a CUDA GPU and ``pip install flash-attn``)."""
    from flash_attn import flash_attn_varlen_func

    cu = batch["cu_seqlens"].to(q.device)                           # int32 (B + 1,)
    m = batch["max_seqlen"]
    return flash_attn_varlen_func(q, k, v, cu, cu, m, m, dropout_p=0.0, causal=False)  # q, k, v, out: (ΣT, H, d)


def per_clip_attention(q, k, v, batch):
    """Reference: attention over each clip alone, concatenated."""
    cu = batch["cu_seqlens"].tolist()
    parts = [F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v))).transpose(0, 1)
             for a, b in zip(cu[:-1], cu[1:])]
    return torch.cat(parts)


@torch.no_grad()  # a forward check (this CPU build of flex_attention has no backward)
def check_attention(batch, qkv) -> None:
    q, k, v = qkv(batch["features"]).reshape(-1, 3, HEADS, HEAD_DIM).unbind(1)
    want = per_clip_attention(q, k, v, batch)
    torch.testing.assert_close(sdpa_attention(q, k, v, batch), want, rtol=1e-4, atol=1e-5)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager flex_attention warns that it is not compiled
            got = flex_attention_packed(q, k, v, batch)
    except Exception as exc:  # e.g. a torch build without flex_attention on this device
        print(f"flex_attention: not run here ({type(exc).__name__})")
    else:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        print("flex_attention: equal to per-clip attention")
    print("SDPA with a block-diagonal mask: equal to per-clip attention")


def map_style(rank: int, budget: int) -> None:
    lengths = clip_lengths(600)
    sampler = DynamicBatchSampler(lengths, max_batch_tokens=budget, planner="bucketed", pack=True,
                                  rank=None, world_size=None)
    loader = DataLoader(Features(lengths), batch_sampler=sampler, collate_fn=collate_packed)
    qkv = torch.nn.Linear(FEATURES, 3 * HEADS * HEAD_DIM)
    opt = torch.optim.AdamW(qkv.parameters(), lr=1e-3)
    frames = 0
    for i, batch in enumerate(loader):
        x, cu = batch["features"], batch["cu_seqlens"]                # (ΣT, 80) float32, (B + 1,) int32
        assert x.shape[0] == int(cu[-1]) <= budget or len(batch["keys"]) == 1  # no padding, within the budget
        if i == 0 and rank == 0:
            check_attention(batch, qkv)
        q, k, v = qkv(x).reshape(-1, 3, HEADS, HEAD_DIM).unbind(1)
        loss = sdpa_attention(q, k, v, batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        frames += x.shape[0]
    print(f"rank {rank}: map-style: {len(sampler)} packed batches, {frames:,} frames, none of them padding")


def streaming(rank: int, directory: str) -> None:
    pattern = os.path.join(directory, "train-{000000..000007}.tar")
    if rank == 0:
        pattern = write_shards(directory, shards=8, per_shard=40)
        index_shards(pattern, length_from="json:duration", frames_per_second=50, progress=False)
    if dist.is_initialized():
        dist.barrier()  # the shards and their sidecars are written
    ds = StreamingBatches(pattern, max_batch_tokens=2_000, pack=True, decode="audio", collate_fn=collate_packed,
                          window_samples=160)
    clips = 0
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        audio, cu = batch["audio"], batch["cu_seqlens"]                # (1, ΣT) float32, (B + 1,) int32
        assert audio.shape[1] == int(cu[-1]) and cu.dtype == torch.int32
        clips += len(batch["keys"])
    print(f"rank {rank}: streaming: {len(ds)} packed batches, {clips} clips")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="write the shards here (default: a temporary directory)")
    p.add_argument("--budget", type=int, default=8_000, help="max_batch_tokens of the map-style run (frames)")
    args = p.parse_args()
    if "RANK" in os.environ:  # under torchrun: the sampler and the dataset read rank and world size from here
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    map_style(rank, args.budget)
    streaming(rank, args.dir or tempfile.mkdtemp(prefix="streambatch-packed-"))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
