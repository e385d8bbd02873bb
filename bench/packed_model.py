"""``bench/model.py``'s encoder trained on packed (padding-free) batches (not part of the library).

The samples of a batch are concatenated along time: the convolutions run
over the whole packed sequence, each sample in its own slot (starting at a
multiple of 4 frames, followed by at least 4 zero frames, the gaps zeroed
again after the first convolution), so no frame sees another sample's; the
transformer layers (the same ``nn.TransformerEncoderLayer`` weights, pre-norm,
no dropout) run their projections, norms and FFN on the packed tokens and
their attention within each sample (one SDPA call per group of near-equal
lengths, the few padded keys masked: ``attend``), as flash-attn's varlen
kernel does in one call on a GPU; CTC
takes each sample's true length. ``check()`` shows the packed step computes
what each sample alone computes (float64).

    make_packed_step() -> step(lengths)   # one forward + CTC backward + AdamW step on a packed batch
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from model import FEATURES, HEADS, VOCAB, Encoder
from torch import nn


def slots(lengths: list[int]) -> tuple[list[int], int]:
    """(start frame of each sample, total frames): slots of 4 * ceil(T / 4) + 4 frames."""
    starts, at = [], 0
    for t in lengths:
        starts.append(at)
        at += 4 * (-(-t // 4)) + 4
    return starts, at


def subsample(model: Encoder, feats: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """The conv subsampling of every sample, on one packed sequence.

    feats: B tensors (T_i, 80). Returns ((sum ceil(T_i / 4), DIM) tokens, [ceil(T_i / 4)])."""
    lengths = [int(f.shape[0]) for f in feats]
    starts, total = slots(lengths)
    x = feats[0].new_zeros(total, FEATURES)
    keep1 = torch.zeros(total // 2, dtype=torch.bool)
    keep2 = torch.zeros(total // 4, dtype=torch.bool)
    out_lengths = []
    for s, f, t in zip(starts, feats, lengths):
        x[s : s + t] = f
        half = -(-t // 2)
        keep1[s // 2 : s // 2 + half] = True
        n = -(-half // 2)  # ceil(ceil(T / 2) / 2), what the per-sample convolutions give
        keep2[s // 4 : s // 4 + n] = True
        out_lengths.append(n)
    conv1, act1, conv2, act2 = model.sub
    h = act1(conv1(x.t().unsqueeze(0)))[0]  # (DIM, total / 2)
    h = h * keep1.to(h.dtype)  # the gaps back to zero: the next convolution reads across them
    h = act2(conv2(h.unsqueeze(0)))[0]  # (DIM, total / 4)
    return h.t()[keep2], out_lengths


GROUP_WASTE = 0.2  # a group's padded attention may cost this much more than its samples' own


def groups_of(lengths: list[int]) -> list[list[int]]:
    """The samples (indices) in groups of near-equal length: sorted by length,
    a group grows while count x longest**2 stays within 1 + GROUP_WASTE of
    the sum of its lengths**2, so few SDPA calls waste little attention."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    out: list[list[int]] = []
    cur: list[int] = []
    own = 0
    for i in order:
        t = lengths[i]
        if cur and (len(cur) + 1) * t * t > (1 + GROUP_WASTE) * (own + t * t):
            out.append(cur)
            cur, own = [], 0
        cur.append(i)
        own += t * t
    return out + ([cur] if cur else [])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Attention within each sample of packed (N, H, d) q, k, v: one SDPA call
    per group of near-equal lengths, padded to its longest with the padding
    masked out as keys (per-sample calls cost ~0.3 ms each on this CPU: a
    step of 30 distinct lengths spent 20 % more than one of equal lengths)."""
    out = torch.empty_like(q)
    starts = [0]
    for t in lengths[:-1]:
        starts.append(starts[-1] + t)
    for group in groups_of(lengths):
        longest = max(lengths[i] for i in group)
        pos = torch.arange(longest)
        lens = torch.tensor([lengths[i] for i in group])
        valid = pos[None, :] < lens[:, None]  # (g, longest)
        idx = torch.where(valid, torch.tensor([starts[i] for i in group])[:, None] + pos[None, :], 0)
        qs, ks, vs = (z[idx].transpose(1, 2) for z in (q, k, v))  # (g, H, longest, d)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=valid[:, None, None, :]).transpose(1, 2)
        out[idx[valid]] = o[valid]
    return out


def layer_forward(layer: nn.TransformerEncoderLayer, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """``layer`` (norm_first, no dropout) on packed tokens x (N, DIM)."""
    n, dim = x.shape
    attn = layer.self_attn
    qkv = F.linear(layer.norm1(x), attn.in_proj_weight, attn.in_proj_bias).view(n, 3, HEADS, dim // HEADS)
    h = attend(qkv[:, 0], qkv[:, 1], qkv[:, 2], lengths).reshape(n, dim)
    x = x + attn.out_proj(h)
    return x + layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))


def forward(model: Encoder, feats: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """((N, VOCAB) log-probabilities of every sample's tokens, packed; token counts)."""
    h, lengths = subsample(model, feats)
    for layer in model.enc.layers:
        h = layer_forward(layer, h, lengths)
    return model.out(h).log_softmax(-1), lengths


def make_packed_step(seed: int = 0, threads: int | None = 1):
    """``step(lengths)``: one forward + CTC backward + AdamW step on random
    features of a packed batch of those lengths (frames)."""
    if threads is not None:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    model = Encoder()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ctc = nn.CTCLoss(zero_infinity=True)

    def step(lengths: list[int]) -> float:
        x = torch.randn(sum(lengths), FEATURES, generator=g)
        feats = list(torch.split(x, list(lengths)))
        logp, tokens = forward(model, feats)
        padded = nn.utils.rnn.pad_sequence(list(torch.split(logp, tokens)))  # (T', B, V) for CTC, true lengths
        target_len = [max(1, t // 4) for t in tokens]
        targets = torch.randint(1, VOCAB, (sum(target_len),), generator=g)
        loss = ctc(padded, targets, torch.tensor(tokens), torch.tensor(target_len))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def check() -> None:
    """The packed forward equals each sample's own forward (float64)."""
    torch.manual_seed(0)
    model = Encoder().double()
    lengths = [37, 5, 120, 64, 8, 9, 121]
    feats = [torch.randn(t, FEATURES, dtype=torch.float64) for t in lengths]
    packed, tokens = forward(model, feats)
    alone = [model(f.unsqueeze(0))[0] for f in feats]
    assert tokens == [a.shape[0] for a in alone]
    err = (packed - torch.cat(alone)).abs().max().item()
    assert err < 1e-9, err
    print(f"packed step == per-sample steps: {len(lengths)} samples, {sum(tokens)} tokens, max |diff| {err:.1e}")
