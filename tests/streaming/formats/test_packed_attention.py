"""A real transformer encoder on packed batches the planner made: the packed
forward (SDPA with a block-diagonal mask; flex_attention with a document
mask, forward only, as this CPU build has no flex backward) equals each
sample's own unpadded forward, and so do the gradients (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from streambatch import collate_packed, make_plan
from streambatch.streaming.formats.packed import block_diagonal_mask, document_ids

FEAT, DIM, HEADS, LAYERS, MAX_POS = 12, 32, 4, 2, 256


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.ffn = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor, attend) -> torch.Tensor:
        """x: (T, DIM), one sequence (a sample, or a packed batch); attend(q, k, v) on (1, H, T, d)."""
        t = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, HEADS, DIM // HEADS).permute(1, 2, 0, 3).unsqueeze(1)
        h = attend(q, k, v).squeeze(0).transpose(0, 1).reshape(t, DIM)
        x = x + self.proj(h)
        return x + self.ffn(self.norm2(x))


class Encoder(nn.Module):
    """Linear input, learned positions (by position id: they restart in every sample), pre-norm blocks."""

    def __init__(self):
        super().__init__()
        self.inp, self.pos = nn.Linear(FEAT, DIM), nn.Embedding(MAX_POS, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.out = nn.Linear(DIM, 8)

    def forward(self, feats: torch.Tensor, position_ids: torch.Tensor, attend) -> torch.Tensor:
        x = self.inp(feats) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x, attend)
        return self.out(x)


def full(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def masked(mask):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def planned_batches(lengths: np.ndarray, feats: list[torch.Tensor]):
    """The packed batches of a 2-rank plan (budget 160 tokens), collated."""
    plan = make_plan(lengths, 160, 16, 2, seed=3, planner="bucketed", pack=True)
    for s in range(plan.num_steps):
        for r in range(2):
            idx = plan.batch(s, r).tolist()
            assert sum(int(lengths[i]) for i in idx) <= 160 or len(idx) == 1
            yield idx, collate_packed([{"__key__": i, "features": feats[i]} for i in idx])


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = Encoder().double()
    rng = np.random.default_rng(1)
    lengths = rng.integers(2, 70, 40)
    g = torch.Generator().manual_seed(2)
    feats = [torch.randn(int(t), FEAT, generator=g, dtype=torch.float64) for t in lengths]
    return model, lengths, feats


def test_sdpa_packed_forward_and_gradients_equal_unpacked(setup):
    model, lengths, feats = setup
    checked = multi = 0
    for idx, batch in planned_batches(lengths, feats):
        assert batch["keys"] == idx
        w = torch.randn(int(batch["lengths"].sum()), 8, generator=torch.Generator().manual_seed(len(idx)),
                        dtype=torch.float64)
        model.zero_grad()
        packed = model(batch["features"], batch["position_ids"], masked(block_diagonal_mask(batch["cu_seqlens"])))
        (packed * w).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        cu = batch["cu_seqlens"].tolist()
        alone = []
        for j, i in enumerate(idx):  # each sample by itself: no padding, no mask, positions 0..T-1
            y = model(feats[i], torch.arange(feats[i].shape[0]), full)
            (y * w[cu[j] : cu[j + 1]]).sum().backward()
            alone.append(y.detach())
        torch.testing.assert_close(packed.detach(), torch.cat(alone), rtol=1e-9, atol=1e-10)
        for gp, p in zip(grads, model.parameters()):
            torch.testing.assert_close(gp, p.grad, rtol=1e-8, atol=1e-10)
        checked += 1
        multi += len(idx) > 1
        if checked == 2:
            break
    assert checked == 2 and multi == 2  # packs of several samples, not only lone ones


def test_the_mask_matters(setup):
    # without the block-diagonal mask samples attend to each other and the outputs differ: the test above can fail
    model, lengths, feats = setup
    idx, batch = next((i, b) for i, b in planned_batches(lengths, feats) if len(i) > 1)
    with torch.no_grad():
        unmasked = model(batch["features"], batch["position_ids"], full)
        packed = model(batch["features"], batch["position_ids"], masked(block_diagonal_mask(batch["cu_seqlens"])))
    assert not torch.allclose(unmasked, packed)


@pytest.mark.slow  # create_block_mask's first call costs ~2 s of set-up on this CPU; the SDPA check is the fast one
def test_flex_attention_document_mask_forward(setup):
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    model, lengths, feats = setup
    idx, batch = next((i, b) for i, b in planned_batches(lengths, feats) if len(i) > 1)
    doc = document_ids(batch["cu_seqlens"])
    total = doc.shape[0]

    def document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    block_mask = flex.create_block_mask(document, None, None, total, total, device="cpu")

    def attend(q, k, v):
        return flex.flex_attention(q, k, v, block_mask=block_mask)

    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention warns that it is not compiled
        try:
            packed = model(batch["features"], batch["position_ids"], attend)
        except (NotImplementedError, RuntimeError) as exc:  # pragma: no cover - depends on the torch build
            pytest.skip(f"flex_attention does not run on this CPU build: {exc}")
        alone = [model(feats[i], torch.arange(feats[i].shape[0]), full) for i in idx]
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-9, atol=1e-10)
