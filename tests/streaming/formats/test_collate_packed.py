"""``collate_packed``: a batch's samples end to end with cu_seqlens, position
ids, lengths and keys, for waveforms, (T, D) features and decoded streaming
samples; the masks built from cu_seqlens; bad batches refused by name."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from streambatch import collate_packed
from streambatch.streaming.formats.packed import block_diagonal_mask, document_ids


def check_layout(out, lengths):
    n = len(lengths)
    cu = out["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.shape == (n + 1,)
    assert cu.tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    assert out["lengths"].dtype == torch.int64 and out["lengths"].tolist() == list(lengths)
    assert out["max_seqlen"] == (max(lengths) if n else 0)
    want = [p for t in lengths for p in range(t)]  # 0..T-1 within every sample
    assert out["position_ids"].dtype == torch.int64 and out["position_ids"].tolist() == want


def test_features_are_concatenated_along_time():
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(t, 5, generator=g) for t in (3, 7, 1, 4)]
    out = collate_packed(feats)
    assert out["features"].shape == (15, 5) and torch.equal(out["features"], torch.cat(feats))
    check_layout(out, [3, 7, 1, 4])
    assert out["keys"] == [None] * 4 and "audio" not in out
    for i, f in enumerate(feats):  # each sample is its cu_seqlens slice
        a, b = out["cu_seqlens"][i : i + 2].tolist()
        assert torch.equal(out["features"][a:b], f)


def test_waveforms_numpy_and_dict_items():
    waves = [np.arange(t, dtype=np.float32) for t in (4, 2, 6)]
    out = collate_packed(waves)
    assert out["audio"].shape == (1, 12) and out["audio"][0, 4:6].tolist() == [0.0, 1.0]
    check_layout(out, [4, 2, 6])
    items = [{"__key__": f"k{i}", "features": torch.ones(t, 3) * i, "text": f"t{i}"} for i, t in enumerate((2, 5))]
    out = collate_packed(items)
    assert out["features"].shape == (7, 3) and out["keys"] == ["k0", "k1"] and out["text"] == ["t0", "t1"]
    check_layout(out, [2, 5])
    two = [dict(x, mel=torch.zeros(x["features"].shape[0], 8)) for x in items]
    with pytest.raises(ValueError, match=r"several \(features, mel\).*key="):
        collate_packed(two)
    with pytest.raises(ValueError, match=r"\['features'\] would overwrite"):
        collate_packed(two, key="mel")  # the packed mel goes out as "features": the member of that name clashes
    out = functools.partial(collate_packed, key="features")(two)
    assert out["features"].shape == (7, 3) and [m.shape for m in out["mel"]] == [(2, 8), (5, 8)]


def test_decoded_streaming_samples():
    samples = [{"__key__": f"s{i}", "flac": (torch.full((1, t), float(i)), 8000), "json": {"i": i}}
               for i, t in enumerate((5, 3, 9))]
    out = collate_packed(samples)
    assert out["audio"].shape == (1, 17) and out["sample_rate"] == 8000
    assert out["keys"] == ["s0", "s1", "s2"] and out["json"] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert out["audio"][0, 5:8].tolist() == [1.0, 1.0, 1.0]
    check_layout(out, [5, 3, 9])
    stereo = [{"__key__": "a", "wav": (torch.zeros(2, 4), 8000)}, {"__key__": "b", "wav": (torch.ones(2, 3), 8000)}]
    assert collate_packed(stereo)["audio"].shape == (2, 7)


def test_empty_batch():
    out = collate_packed([])
    assert out["audio"].shape == (1, 0) and out["cu_seqlens"].tolist() == [0] and out["max_seqlen"] == 0
    assert out["position_ids"].shape == (0,) and out["keys"] == []


def test_masks_from_cu_seqlens():
    cu = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    assert document_ids(cu).tolist() == [0, 0, 1, 1, 1, 2]
    m = block_diagonal_mask(cu)
    assert m.shape == (6, 6) and m.dtype == torch.bool and int(m.sum()) == 4 + 9 + 1
    assert m[1, 0] and not m[1, 2] and m[4, 2] and not m[5, 4]


@pytest.mark.parametrize("batch, error, match", [
    ([torch.zeros(3), torch.zeros(3, 2)], ValueError, "mixes"),
    ([torch.zeros(3, 2), torch.zeros(4, 5)], ValueError, "feature sizes"),
    ([torch.zeros(2, 2, 2)], ValueError, r"shape \(2, 2, 2\)"),
    (["abc"], TypeError, "not a tensor"),
    ([{"__key__": "x", "text": "hi"}], ValueError, "no tensor members"),
    ([{"__key__": "x", "flac": b"raw"}], ValueError, "decode='audio'"),
    ([{"__key__": "x", "wav": (torch.zeros(1, 3), 8000)}, {"__key__": "y", "wav": (torch.zeros(1, 3), 16000)}],
     ValueError, "sample rates"),
    ([{"__key__": "x", "wav": (torch.zeros(1, 3), 8000)}, {"__key__": "y", "wav": (torch.zeros(2, 3), 8000)}],
     ValueError, "channel counts"),
])
def test_bad_batches_are_named(batch, error, match):
    with pytest.raises(error, match=match):
        collate_packed(batch)
    with pytest.raises(ValueError, match="no member 'mel'"):
        collate_packed([{"__key__": "x", "features": torch.zeros(2, 2)}], key="mel")
