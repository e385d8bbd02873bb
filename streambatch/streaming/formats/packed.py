"""Packed (padding-free) batches for variable-length attention: ``collate_packed``
concatenates a batch's samples along time, with the ``cu_seqlens`` /
``position_ids`` convention of flash-attn's varlen kernels and HF's
flattening collator, and the two masks the other attention paths need.

Use it with batches planned packed (``pack=True``), whose sum of lengths is
within ``max_batch_tokens``::

    DataLoader(ds, batch_sampler=DynamicBatchSampler(lengths, 16_000, planner="bucketed", pack=True),
               collate_fn=collate_packed)
    StreamingBatches(urls, 16_000, pack=True, decode="audio", collate_fn=collate_packed)

Stream: a batch of samples -> one packed batch dict (tensors end to end, ``cu_seqlens``, ``position_ids``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .audio import audio_ext


def _time_major(x: Any, where: str) -> Any:
    """A sample's tensor: (T,) or (C, T) audio stays, (T, D) features stay; numpy becomes torch."""
    import torch

    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{where} is a {type(x).__name__}, not a tensor or array; collate_packed packs tensors "
                            "(T,) (a waveform), (T, D) (features) or decoded audio") from None
    if x.dim() not in (1, 2):
        raise ValueError(f"{where} has shape {tuple(x.shape)}; collate_packed packs (T,) waveforms or (T, D) "
                         "features (decoded audio is (C, T)); reshape it, or collate it yourself")
    return x


def _float_audio(x: Any, where: str) -> Any:
    """A waveform as float32 on one scale: floats as they are, integer PCM divided by its full scale
    (int16 by 2**15, int32 by 2**31, int8 by 2**7; unsigned 8-bit centred at 128, as WAV stores it), so that
    samples decoded to different types land on the same [-1, 1) scale."""
    import torch

    if x.dtype.is_floating_point:
        return x.to(torch.float32)
    bits = {torch.int8: 7, torch.int16: 15, torch.int32: 31}.get(x.dtype)
    if bits is not None:
        return x.to(torch.float32) / float(1 << bits)
    if x.dtype == torch.uint8:
        return (x.to(torch.float32) - 128.0) / 128.0
    raise TypeError(f"{where} is a {x.dtype} waveform, which is no PCM sample width collate_packed can scale; "
                    "convert it to float (in [-1, 1]) or to int16/int32 PCM first")


def _payload(sample: Any, key: str | None, i: int) -> tuple[Any, str | None, Any]:
    """(tensor, member name or None, sample rate or None) of one sample;
    decoded audio is (C, T) with its rate, anything else (T,) or (T, D)."""
    if not isinstance(sample, dict):
        return _time_major(sample, f"sample {i}"), None, None
    if key is None:
        found = [k for k, v in sample.items() if audio_ext(k) and isinstance(v, tuple)]
        if not found:
            found = [k for k, v in sample.items() if not k.startswith("__") and hasattr(v, "shape")]
            if len(found) != 1:
                members = sorted(k for k in sample if not k.startswith("__"))
                why = "no" if not found else f"several ({', '.join(found)})"
                raise ValueError(f"sample {sample.get('__key__', i)!r} has {why} tensor members among {members}: "
                                 "name one with key= (functools.partial(collate_packed, key='features')), or "
                                 "pass decode='audio' to StreamingBatches for raw audio bytes")
        key = found[0]
    elif key not in sample:
        members = sorted(k for k in sample if not k.startswith("__"))
        raise ValueError(f"sample {sample.get('__key__', i)!r} has no member {key!r}; its members are {members}")
    value = sample[key]
    if isinstance(value, tuple) and len(value) == 2:  # decoded audio: ((C, T) tensor, sample rate)
        x = _time_major(value[0], f"sample {i}'s {key!r}")
        return (x if x.dim() == 2 else x.reshape(1, -1)), key, value[1]
    return _time_major(value, f"sample {i}'s {key!r}"), key, None


def collate_packed(batch: Sequence[Any], key: str | None = None) -> dict[str, Any]:
    """Concatenate the samples of a batch along time, with no padding.

    Each sample is a tensor or array ((T,) a waveform, (T, D) features), or
    a dict (a map-style item, or a decoded streaming sample) holding one:
    its decoded audio member, the member named ``key``, or its only tensor.

    Returns a dict:
      ``audio`` (C, sum T) float32 for waveforms ((1, sum T) when mono;
      integer PCM scaled to [-1, 1) by its full scale, floats as they are) or
      ``features`` (sum T, D) for features: the samples end to end;
      ``cu_seqlens`` (B + 1,) int32: sample i is ``[cu_seqlens[i], cu_seqlens[i + 1])``;
      ``max_seqlen`` int: the longest T (flash-attn's ``max_seqlen_q/k``);
      ``position_ids`` (sum T,) int64: 0..T-1 within each sample (HF's
      flattened batches take it as (1, sum T): ``position_ids[None]``);
      ``lengths`` (B,) int64; ``keys``: each sample's ``__key__`` (None for
      tensors); ``sample_rate`` for decoded audio; every other dict member
      as a list.
    An empty batch gives B = 0 and sum T = 0 (an ``audio`` (1, 0)).
    """
    import torch

    parts, rates, kinds, others = [], set(), set(), {}
    keys: list[Any] = []
    for i, s in enumerate(batch):
        x, member, rate = _payload(s, key, i)
        parts.append(x)
        kinds.add("decoded" if rate is not None else x.dim())  # decoded (C, T), waveform (T,), features (T, D)
        if rate is not None:
            rates.add(rate)
        keys.append(s.get("__key__") if isinstance(s, dict) else None)
        if isinstance(s, dict):
            for k, v in s.items():
                if not k.startswith("__") and k != member:
                    others.setdefault(k, []).append(v)
    if len(rates) > 1:
        raise ValueError(f"a batch mixes sample rates {sorted(rates)}; resample the corpus to one rate")
    if len(kinds) > 1:
        raise ValueError("a batch mixes decoded audio, (T,) waveforms and (T, D) features; pack one kind per batch")
    audio = kinds != {2}
    if audio:
        parts = [_float_audio(p if p.dim() == 2 else p.reshape(1, -1), f"sample {i}") for i, p in enumerate(parts)]
        channels = {p.shape[0] for p in parts}
        if len(channels) > 1:
            raise ValueError(f"a batch mixes channel counts {sorted(channels)}; downmix the corpus to one")
        lengths = [p.shape[1] for p in parts]
        packed = torch.cat(parts, dim=1) if parts else torch.zeros(1, 0)
    else:
        dims = {p.shape[1] for p in parts}
        if len(dims) > 1:
            raise ValueError(f"a batch mixes feature sizes {sorted(dims)}; every sample must be (T, D) with one D")
        dtypes = {p.dtype for p in parts}
        if len(dtypes) > 1:  # torch.cat would promote silently (int token ids beside float features)
            raise ValueError(f"a batch mixes dtypes {sorted(map(str, dtypes))} of (T, D) features; give every "
                             "sample the same dtype")
        lengths = [p.shape[0] for p in parts]
        packed = torch.cat(parts, dim=0)
    lens = torch.tensor(lengths, dtype=torch.int64)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0).to(torch.int32)
    starts = torch.repeat_interleave(cu[:-1].to(torch.int64), lens)
    out = {
        "audio" if audio else "features": packed,
        "cu_seqlens": cu,
        "max_seqlen": int(lens.max()) if lengths else 0,
        "position_ids": torch.arange(int(lens.sum()), dtype=torch.int64) - starts,
        "lengths": lens,
        "keys": keys,
    }
    if rates:
        out["sample_rate"] = rates.pop()
    clash = sorted(set(others) & (set(out) | {"audio", "features"}))
    if clash:
        raise ValueError(f"sample member(s) {clash} would overwrite collate_packed's output of that name; rename "
                         "them, or pack that member with key=")
    out.update(others)
    return out


def document_ids(cu_seqlens: Any) -> Any:
    """(sum T,) int64 index of the sample each position belongs to, from
    ``cu_seqlens`` (B + 1,): what a ``flex_attention`` document mask compares
    (``doc[q] == doc[kv]``)."""
    import torch

    cu = torch.as_tensor(cu_seqlens).to(torch.int64)
    return torch.repeat_interleave(torch.arange(cu.shape[0] - 1), cu[1:] - cu[:-1])


def block_diagonal_mask(cu_seqlens: Any) -> Any:
    """(sum T, sum T) bool, True where query and key are in the same sample:
    ``attn_mask`` for ``scaled_dot_product_attention`` over a packed batch
    (memory quadratic in sum T: for short packs and checks; use flex_attention
    or flash-attn's varlen kernels for long ones)."""
    doc = document_ids(cu_seqlens)
    return doc[:, None] == doc[None, :]
