"""Audio lengths from headers (no decoding), plus the optional decode/collate.

Indexing needs only the number of frames and the sample rate of each audio
member. WAV (RIFF/RF64) and FLAC store both in their first bytes, so they are
parsed here by hand: indexing reads a few kilobytes per sample instead of the
audio. Other containers fall back to ``soundfile.info`` on the whole member.
``AUDIO_FORMATS`` is the one list of audio suffixes: what lengths measure is
what ``decode_audio`` decodes.

Stream: audio headers (length, rate) for the indexer; decoded (tensor, rate) samples for decode="audio"."""

from __future__ import annotations

import functools
import io
import struct
import sys
from typing import Any

# Member suffix -> the soundfile (libsndfile) format that decodes it: one registry for
# lengths (``audio`` / ``audio:SUFFIX``), ``decode_audio`` and ``collate_audio``. Only
# suffixes that name audio unambiguously: not .mat (Matlab data), .htk (mostly features),
# .raw (no header), .mpc (Musepack, which libsndfile does not read) or .sd2 (resource forks).
AUDIO_FORMATS: dict[str, str] = {
    "wav": "WAV", "wave": "WAV", "rf64": "RF64", "w64": "W64", "flac": "FLAC",
    "ogg": "OGG", "oga": "OGG", "opus": "OGG", "mp3": "MP3",
    "sph": "NIST", "nist": "NIST", "aiff": "AIFF", "aif": "AIFF", "aifc": "AIFF",
    "au": "AU", "snd": "AU", "caf": "CAF", "voc": "VOC", "avr": "AVR", "paf": "PAF", "pvf": "PVF",
    "sds": "SDS", "xi": "XI", "wve": "WVE", "ircam": "IRCAM", "svx": "SVX", "8svx": "SVX",
}
AUDIO_EXTS = tuple(AUDIO_FORMATS)
HEADER_EXTS = ("wav", "wave", "rf64", "flac")  # lengths parsed from the first bytes, by hand

# What to install for audio beyond PCM WAV (soundfile, i.e. libsndfile).
AUDIO_EXTRA = "pip install 'streambatch[audio]'"

# Enough for a WAV header with a LIST/INFO chunk before ``data``.
HEADER_BYTES = 64 * 1024


class NeedMoreBytes(Exception):
    """The header runs past the bytes given: retry with the whole member."""


def audio_ext(suffix: str) -> str | None:
    """The audio format of a member suffix (``"16k.flac"`` -> ``"flac"``), else None."""
    ext = suffix.rsplit(".", 1)[-1].lower()
    return ext if ext in AUDIO_FORMATS else None


@functools.cache
def _readable_formats() -> frozenset[str]:
    import soundfile  # optional: only for containers without a hand parser

    return frozenset(soundfile.available_formats())


def soundfile_format(ext: str) -> str:
    """The soundfile format that reads ``ext``, checked against the installed
    libsndfile; ValueError saying what to install otherwise."""
    try:
        readable = _readable_formats()
    except ImportError:
        raise ValueError(f"reading .{ext} audio needs the soundfile package: {AUDIO_EXTRA}") from None
    fmt = AUDIO_FORMATS[ext]
    if fmt not in readable:
        import soundfile

        raise ValueError(f"the installed libsndfile ({soundfile.__libsndfile_version__}) cannot read {fmt} "
                         f"(.{ext}) files; install a newer soundfile (pip install -U soundfile)")
    return fmt


# WAV format tags (and WAVE_FORMAT_EXTENSIBLE sub-formats) whose frames are data bytes / block align
_ONE_FRAME_PER_BLOCK = {0x0001: "PCM", 0x0003: "IEEE float", 0x0006: "A-law", 0x0007: "mu-law"}
_EXTENSIBLE = 0xFFFE


def _codec_frames(tag: int, channels: int, block_align: int, ext: bytes, data: int) -> int | None:
    """Frames of a block-coded WAV ``data`` chunk of ``data`` bytes, counted as
    libsndfile (and so ``decode="audio"``) counts them, or None for a codec
    without such a rule. A final partial block decodes whole; the odd byte of
    an odd-sized chunk counts (RIFF pads chunks to even sizes)."""
    data += data & 1
    if tag in (0x0011, 0x0002):  # IMA ADPCM, MS ADPCM: wSamplesPerBlock in the fmt extension
        if len(ext) < 2:
            raise ValueError(f"WAV {'IMA' if tag == 0x11 else 'MS'} ADPCM fmt chunk has no samples-per-block field")
        (per_block,) = struct.unpack_from("<H", ext)
        if tag == 0x0011:
            return -(-data // block_align) * per_block
        return data // block_align * per_block  # libsndfile drops a partial MS ADPCM block
    if tag == 0x0031:  # GSM 6.10: 320 samples in each 65-byte block
        return -(-data // 65) * 320
    if tag == 0x0040 and channels == 1:  # G.721 ADPCM: 120 samples in 60 bytes
        return -(-data // 60) * 120
    if tag == 0x0038 and channels == 1:  # NMS VBX ADPCM: 160 samples per block
        return -(-data // block_align) * 160
    return None


def wav_info(head: bytes, member_size: int) -> tuple[int, int]:
    """(frames, sample_rate) of a WAV/RF64 file from its first bytes.

    PCM, float, A-law and mu-law: data bytes / block align. Block codecs
    (IMA/MS ADPCM, GSM 6.10, G.721, NMS ADPCM): samples per block x blocks,
    as libsndfile decodes them. Any other codec: the ``fact`` chunk's sample
    count, which may follow ``data`` (then NeedMoreBytes asks for the rest).
    """
    if len(head) < 12 or head[:4] not in (b"RIFF", b"RF64", b"BW64") or head[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE header")
    pos = 12
    block_align = rate = channels = 0
    tag = None
    ext = b""
    ds64_data = fact = None
    data = None  # (size of the data chunk) once seen, for a codec that needs the fact chunk after it
    while True:
        if pos + 8 > len(head):
            if data is not None and pos + 8 > member_size:
                raise ValueError(f"WAV codec 0x{tag:04x} needs a fact chunk (its sample count), and the file has "
                                 "none; re-encode it (e.g. to PCM or FLAC)")
            raise NeedMoreBytes
        cid = head[pos : pos + 4]
        (csize,) = struct.unpack_from("<I", head, pos + 4)
        body = pos + 8
        if cid == b"ds64":
            if body + 16 > len(head):
                raise NeedMoreBytes
            (ds64_data,) = struct.unpack_from("<Q", head, body + 8)
        elif cid == b"fmt ":
            if body + min(csize, 64) > len(head):
                raise NeedMoreBytes
            if csize < 16:
                raise ValueError(f"WAV fmt chunk of {csize} bytes (at least 16 expected)")
            tag, channels, rate, _, block_align = struct.unpack_from("<HHIIH", head, body)
            ext = b""
            if csize >= 18:
                (cb_size,) = struct.unpack_from("<H", head, body + 16)
                ext = head[body + 18 : body + 18 + min(cb_size, csize - 18, 46)]
            if tag == _EXTENSIBLE and len(ext) >= 22:
                (tag,) = struct.unpack_from("<H", ext, 6)  # the first two bytes of the SubFormat GUID
        elif cid == b"fact" and csize >= 4:
            if body + 4 > len(head):
                raise NeedMoreBytes
            (fact,) = struct.unpack_from("<I", head, body)
            if data is not None:
                return fact, rate
        elif cid == b"data" and data is None:
            if not block_align:
                raise ValueError("WAV fmt chunk gives block align 0" if rate else "WAV data chunk before its fmt chunk")
            if csize == 0xFFFFFFFF and ds64_data is not None:
                csize = ds64_data
            elif csize in (0, 0xFFFFFFFF):  # written as a stream: the data runs to the end
                csize = member_size - body
            size = min(csize, member_size - body)
            if tag in _ONE_FRAME_PER_BLOCK or tag == _EXTENSIBLE:
                return size // block_align, rate
            frames = _codec_frames(tag, channels, block_align, ext, size)
            if frames is not None:
                return frames, rate
            if fact is not None:
                return fact, rate
            data = size  # look for a fact chunk after the data
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
    if ext in HEADER_EXTS and ext != "flac":
        frames, rate = wav_info(data, member_size)
    elif ext == "flac":
        frames, rate = flac_info(data)
    else:
        soundfile_format(ext)  # before reading the whole member: say if soundfile cannot read it
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
    ``json`` -> object, ``txt``/``text`` -> str; other members stay bytes.

    Audio is read by soundfile (the ``audio`` extra); without it, 8/16/32-bit PCM
    WAV still decodes (the standard library's ``wave``), and any other audio raises
    an ImportError naming the extra to install."""
    import json

    import numpy as np
    import torch

    soundfile = _soundfile()
    out = {}
    for k, v in sample.items():
        if k.startswith("__") or not isinstance(v, bytes):
            out[k] = v
            continue
        ext = k.rsplit(".", 1)[-1]
        if audio_ext(k):
            if soundfile is not None:
                x, sr = soundfile.read(io.BytesIO(v), dtype="float32", always_2d=True)
            else:
                x, sr = read_pcm_wav(v, k)
            out[k] = (torch.from_numpy(np.ascontiguousarray(x.T)), sr)
        elif ext == "json":
            out[k] = json.loads(v)
        elif ext in ("txt", "text"):
            out[k] = v.decode("utf-8")
        else:
            out[k] = v
    return out


_NO_SOUNDFILE = False  # an import of soundfile failed: not tried again (a failed import searches sys.path)


def _soundfile() -> Any:
    """The soundfile module, or None without it (the ``audio`` extra), looked
    up once per process rather than once per decoded sample. A module hidden
    by ``sys.modules["soundfile"] = None`` counts as absent."""
    global _NO_SOUNDFILE
    if "soundfile" in sys.modules:
        return sys.modules["soundfile"]
    if _NO_SOUNDFILE:
        return None
    try:
        import soundfile
    except ImportError:
        _NO_SOUNDFILE = True
        return None
    return soundfile


def read_pcm_wav(data: bytes, member: str):
    """(float32 array (T, C), sample rate) of a PCM WAV file, scaled as soundfile
    scales it (int16 / 2**15, ...), with the standard library alone."""
    import wave

    import numpy as np

    if audio_ext(member) not in ("wav", "wave"):
        raise ImportError(f"decoding .{member.rsplit('.', 1)[-1]} audio needs soundfile (only PCM WAV decodes "
                          f"without it): {AUDIO_EXTRA}")
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ImportError(f"this .{member} member is not plain PCM WAV ({exc}); decoding it needs soundfile: "
                          f"{AUDIO_EXTRA}") from None
    if width == 1:  # 8-bit WAV is unsigned
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128) / 128
    elif width in (2, 4):
        ints = np.frombuffer(raw, f"<i{width}")
        x = ints.astype(np.float32) / float(2 ** (8 * width - 1))
    else:
        raise ImportError(f"{8 * width}-bit WAV needs soundfile to decode: {AUDIO_EXTRA}")
    return x.reshape(-1, channels), rate


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
            members = sorted(k for k in s if not k.startswith("__"))
            if any(audio_ext(k) for k in members):
                why = "its audio is still bytes: pass decode='audio' to StreamingBatches"
            else:
                why = f"none of its members {members} has an audio suffix ({', '.join(AUDIO_EXTS)})"
            raise ValueError(f"sample {s.get('__key__')!r} has no decoded audio member: {why}")
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
