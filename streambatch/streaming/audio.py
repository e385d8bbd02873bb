"""Audio lengths from headers (no decoding), plus the optional decode/collate.

Indexing needs only the number of frames and the sample rate of each audio
member. WAV (RIFF/RF64) and FLAC store both in their first bytes, so they are
parsed here by hand: indexing reads a few kilobytes per sample instead of the
audio. Other containers fall back to ``soundfile.info`` on the whole member.
"""

from __future__ import annotations

import io
import struct
from typing import Any

AUDIO_EXTS = ("flac", "wav", "ogg", "opus", "mp3")

# Enough for a WAV header with a LIST/INFO chunk before ``data``.
HEADER_BYTES = 64 * 1024


class NeedMoreBytes(Exception):
    """The header runs past the bytes given: retry with the whole member."""


def audio_ext(suffix: str) -> str | None:
    """The audio format of a member suffix (``"16k.flac"`` -> ``"flac"``), else None."""
    ext = suffix.rsplit(".", 1)[-1].lower()
    return ext if ext in AUDIO_EXTS else None


def wav_info(head: bytes, member_size: int) -> tuple[int, int]:
    """(frames, sample_rate) of a WAV/RF64 file from its first bytes."""
    if len(head) < 12 or head[:4] not in (b"RIFF", b"RF64", b"BW64") or head[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE header")
    pos = 12
    block_align = rate = 0
    ds64_data = None
    while True:
        if pos + 8 > len(head):
            raise NeedMoreBytes
        cid = head[pos : pos + 4]
        (csize,) = struct.unpack_from("<I", head, pos + 4)
        body = pos + 8
        if cid == b"ds64":
            if body + 16 > len(head):
                raise NeedMoreBytes
            (ds64_data,) = struct.unpack_from("<Q", head, body + 8)
        elif cid == b"fmt ":
            if body + 16 > len(head):
                raise NeedMoreBytes
            _, _, rate, _, block_align = struct.unpack_from("<HHIIH", head, body)
        elif cid == b"data":
            if not block_align:
                raise ValueError("WAV fmt chunk gives block align 0" if rate else "WAV data chunk before its fmt chunk")
            if csize == 0xFFFFFFFF and ds64_data is not None:
                csize = ds64_data
            elif csize in (0, 0xFFFFFFFF):  # written as a stream: the data runs to the end
                csize = member_size - body
            csize = min(csize, member_size - body)
            return csize // block_align, rate
        pos = body + csize + (csize & 1)


def flac_info(head: bytes) -> tuple[int, int]:
    """(frames, sample_rate) of a FLAC file from its STREAMINFO block."""
    pos = 0
    if head[:3] == b"ID3":  # an ID3v2 tag may precede the stream marker
        if len(head) < 10:
            raise NeedMoreBytes
        size = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]
        pos = 10 + size
    if len(head) < pos + 4 + 4 + 18:
        raise NeedMoreBytes
    if head[pos : pos + 4] != b"fLaC":
        raise ValueError("not a FLAC stream (no fLaC marker)")
    if head[pos + 4] & 0x7F != 0:
        raise ValueError("FLAC stream does not start with STREAMINFO")
    info = head[pos + 8 : pos + 8 + 18]
    bits = int.from_bytes(info[10:18], "big")
    rate = bits >> 44
    frames = bits & ((1 << 36) - 1)
    if frames == 0:
        raise ValueError("FLAC STREAMINFO does not record the number of samples")
    return frames, rate


def audio_info(data: bytes, ext: str, member_size: int) -> tuple[int, int]:
    """(frames, sample_rate) of an audio member; ``data`` may be just its head.

    Raises NeedMoreBytes when ``data`` is a prefix too short to decide.
    """
    if ext == "wav":
        frames, rate = wav_info(data, member_size)
    elif ext == "flac":
        frames, rate = flac_info(data)
    else:
        if len(data) < member_size:
            raise NeedMoreBytes
        import soundfile  # optional: only for containers without a fixed header

        info = soundfile.info(io.BytesIO(data))
        frames, rate = int(info.frames), int(info.samplerate)
    if rate <= 0:  # seconds = frames / rate
        raise ValueError(f"the header gives sample rate {rate}")
    return frames, rate


def decode_audio(sample: dict[str, Any]) -> dict[str, Any]:
    """Decode a raw sample: audio members -> (float32 tensor (C, T), sample_rate),
    ``json`` -> object, ``txt``/``text`` -> str; other members stay bytes."""
    import json

    import numpy as np
    import soundfile
    import torch

    out = {}
    for k, v in sample.items():
        if k.startswith("__") or not isinstance(v, bytes):
            out[k] = v
            continue
        ext = k.rsplit(".", 1)[-1]
        if audio_ext(k):
            x, sr = soundfile.read(io.BytesIO(v), dtype="float32", always_2d=True)
            out[k] = (torch.from_numpy(np.ascontiguousarray(x.T)), sr)
        elif ext == "json":
            out[k] = json.loads(v)
        elif ext in ("txt", "text"):
            out[k] = v.decode("utf-8")
        else:
            out[k] = v
    return out


def collate_audio(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Pad decoded samples into one batch.

    Returns ``audio`` (B, T) float32 for mono, else (B, C, T), zero-padded at
    the end; ``audio_lengths`` (B,) int64 frames; ``sample_rate``; ``keys``;
    and every other member as a list. An empty batch (every sample skipped
    with ``on_error="skip"``) gives B = 0.
    """
    import torch

    audio, others = [], {}
    rates = set()
    for s in batch:
        found = None
        for k, v in s.items():
            if found is None and audio_ext(k) and isinstance(v, tuple):
                found = v
            elif not k.startswith("__") and not audio_ext(k):
                others.setdefault(k, []).append(v)
        if found is None:
            raise ValueError(f"sample {s.get('__key__')!r} has no decoded audio member; pass decode='audio'")
        audio.append(found[0])
        rates.add(found[1])
    if len(rates) > 1:
        raise ValueError(f"a batch mixes sample rates {sorted(rates)}; resample the corpus to one rate")
    channels = max((a.shape[0] for a in audio), default=1)
    longest = max((a.shape[1] for a in audio), default=0)
    out = torch.zeros(len(audio), channels, longest)
    for i, a in enumerate(audio):
        out[i, : a.shape[0], : a.shape[1]] = a
    result = {
        "audio": out[:, 0] if channels == 1 else out,
        "audio_lengths": torch.tensor([a.shape[1] for a in audio], dtype=torch.int64),
        "sample_rate": rates.pop() if rates else None,
        "keys": [s["__key__"] for s in batch],
    }
    result.update(others)
    return result
