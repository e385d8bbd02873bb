"""Audio lengths and decoding across formats, on files written by soundfile.

Block-coded WAV (IMA/MS ADPCM, GSM 6.10, ...) must index as many frames as
``decode="audio"`` yields (soundfile's count, not data bytes / block align);
every suffix ``audio:SUFFIX`` accepts must decode with ``decode="audio"``
(NIST SPHERE, AIFF, W64, ...), and any other suffix is refused up front."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
import soundfile
import webdataset as wds

from streambatch.streaming import StreamingBatches, collate_audio, decode_audio, index_shards
from streambatch.streaming.formats.audio import AUDIO_FORMATS, audio_info, wav_info
from streambatch.streaming.shards.lengths import length_spec

RATE = 16000
# (subtype, channels) of every block-coded WAV libsndfile writes (GSM, G.721 and NMS: mono only)
BLOCK_CODECS = [("IMA_ADPCM", 1), ("IMA_ADPCM", 2), ("MS_ADPCM", 1), ("MS_ADPCM", 2), ("GSM610", 1),
                ("G721_32", 1), ("NMS_ADPCM_16", 1), ("NMS_ADPCM_32", 1)]


def tone(frames: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (0.3 * np.sin(np.arange(frames) * rng.uniform(0.02, 0.2))).astype(np.float32)
    return np.stack([x, -x], 1) if channels == 2 else x


def encode(x: np.ndarray, fmt: str, subtype: str | None = None, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def chunks(wav: bytes) -> dict[bytes, tuple[int, int]]:
    out, pos = {}, 12
    while pos + 8 <= len(wav):
        cid, (size,) = wav[pos : pos + 4], struct.unpack_from("<I", wav, pos + 4)
        out[cid] = (pos, size)
        pos += 8 + size + (size & 1)
    return out


def cut_data(wav: bytes, cut: int) -> bytes:
    """``wav`` with its data chunk ``cut`` bytes shorter (a partial last block), RIFF-padded."""
    pos, size = chunks(wav)[b"data"]
    out = bytearray(wav[: pos + 8 + size - cut])
    struct.pack_into("<I", out, pos + 4, size - cut)
    out += bytes((size - cut) & 1)
    struct.pack_into("<I", out, 4, len(out) - 8)
    return bytes(out)


@pytest.mark.parametrize("subtype,channels", BLOCK_CODECS)
def test_block_coded_wav_frames_match_soundfile(subtype, channels):
    wav = encode(tone(16000, channels), "WAV", subtype)
    (block_align,) = struct.unpack_from("<H", wav, chunks(wav)[b"fmt "][0] + 8 + 12)
    for cut in (0, 1, 2, block_align // 2, block_align - 1, block_align, block_align + 1):
        data = cut_data(wav, cut) if cut else wav
        want = soundfile.info(io.BytesIO(data)).frames
        assert wav_info(data, len(data)) == (want, RATE), (subtype, channels, cut)
        assert len(soundfile.read(io.BytesIO(data))[0]) == want  # what decode="audio" yields
    # e.g. IMA ADPCM mono: 16 blocks of 1017 samples = 16272 frames (data bytes / block align gave 16)
    assert wav_info(wav, len(wav))[0] > 16000 - 1000


def test_pcm_float_and_extensible_unchanged():
    for fmt, subtype in [("WAV", "PCM_16"), ("WAV", "PCM_24"), ("WAV", "FLOAT"), ("WAV", "ULAW"), ("WAV", "ALAW"),
                         ("WAVEX", "PCM_16"), ("WAVEX", "FLOAT"), ("RF64", "PCM_16")]:
        for channels in (1, 2):
            wav = encode(tone(12345, channels), fmt, subtype)
            assert wav_info(wav, len(wav)) == (12345, RATE), (fmt, subtype)


def _other_codec(wav: bytes, fact: int | None, fact_first: bool) -> bytes:
    """A PCM WAV relabelled as codec 0x0055 (MPEG layer 3: no samples-per-block
    rule), with a fact chunk before or after its data, or none."""
    head = bytearray(wav[:12])
    pos, size = chunks(wav)[b"fmt "]
    fmt = bytearray(wav[pos : pos + 8 + size])
    fmt[8:10] = (0x0055).to_bytes(2, "little")
    dpos, dsize = chunks(wav)[b"data"]
    data = wav[dpos : dpos + 8 + dsize]
    fact_chunk = b"" if fact is None else b"fact" + struct.pack("<II", 4, fact)
    out = head + fmt + (fact_chunk + data if fact_first else data + fact_chunk)
    struct.pack_into("<I", out, 4, len(out) - 8)
    return bytes(out)


def test_other_codecs_take_the_fact_chunk_before_or_after_data(tmp_path):
    wav = encode(tone(50_000), "WAV", "PCM_16")  # 100 KB of data: a fact after it is past a 64 KiB head
    for first in (True, False):
        data = _other_codec(wav, 4321, first)
        assert wav_info(data, len(data)) == (4321, RATE)
    # through the indexer: a head read, then the whole member for the fact chunk after the data
    shard = str(tmp_path / "s.tar")
    with wds.TarWriter(shard) as sink:
        sink.write({"__key__": "a", "wav": _other_codec(wav, 4321, False)})
        sink.write({"__key__": "b", "wav": _other_codec(wav, 999, True)})
    assert index_shards([shard], length_from="audio", workers=1, progress=False).total_length == 4321 + 999
    with wds.TarWriter(shard) as sink:
        sink.write({"__key__": "c", "wav": _other_codec(wav, None, False)})
    with pytest.raises(ValueError, match="needs a fact chunk"):
        index_shards([shard], length_from="audio", workers=1, progress=False, force=True)


def _shard(path, members: list[dict]) -> str:
    with wds.TarWriter(str(path)) as sink:
        for m in members:
            sink.write(m)
    return str(path)


def test_block_coded_wav_shard_lengths_equal_decoded_lengths(tmp_path):
    files = {f"{st}-{i}": encode(tone(9000 + 1777 * i, 1, i), "WAV", st) for i, st in
             enumerate(["IMA_ADPCM", "MS_ADPCM", "GSM610", "IMA_ADPCM", "MS_ADPCM", "GSM610"])}
    shard = _shard(tmp_path / "codecs.tar", [{"__key__": k, "wav": v} for k, v in files.items()])
    summary = index_shards([shard], length_from="audio", workers=1, progress=False)
    ds = StreamingBatches([shard], 10**6, 1, world_size=1, rank=0, decode="audio", collate_fn=collate_audio,
                          length_from="audio")
    got = {b["keys"][0]: int(b["audio_lengths"][0]) for b in ds}
    assert got == {k: soundfile.info(io.BytesIO(v)).frames for k, v in files.items()}
    assert summary.total_length == sum(got.values())  # indexed lengths are the decoded ones


# (suffix, soundfile format, subtype): containers soundfile decodes that have no hand parser
CONTAINERS = [("sph", "NIST", None), ("aiff", "AIFF", None), ("aif", "AIFF", "PCM_24"), ("w64", "W64", None),
              ("au", "AU", None), ("caf", "CAF", "FLOAT"), ("ogg", "OGG", None)]


@pytest.mark.parametrize("suffix,fmt,subtype", CONTAINERS)
def test_indexed_formats_decode(tmp_path, suffix, fmt, subtype):
    originals = {f"u{i}": encode(tone(4000 + 1500 * i, 1 + i % 2, i), fmt, subtype) for i in range(4)}
    members = [{"__key__": k, suffix: v, "json": json.dumps({"i": k}).encode()} for k, v in originals.items()]
    shard = _shard(tmp_path / "fmt.tar", members)
    summary = index_shards([shard], length_from=f"audio:{suffix}", workers=1, progress=False)
    assert summary.total_length == sum(soundfile.info(io.BytesIO(v)).frames for v in originals.values())
    ds = StreamingBatches([shard], 10**6, 1, world_size=1, rank=0, decode="audio", collate_fn=collate_audio)
    seen = 0
    for batch in ds:
        (key,) = batch["keys"]
        ref, rate = soundfile.read(io.BytesIO(originals[key]), dtype="float32", always_2d=True)
        audio = batch["audio"][0].numpy()  # (T,) mono, (C, T) otherwise
        assert batch["sample_rate"] == rate == RATE
        np.testing.assert_array_equal(audio if audio.ndim == 2 else audio[None], ref.T)
        assert batch["json"] == [{"i": key}]
        seen += 1
    assert seen == 4
    # length_from="audio" (no suffix) measures them too
    summary = index_shards([shard], length_from="audio", workers=1, progress=False, force=True)
    assert summary.total_length == sum(soundfile.info(io.BytesIO(v)).frames for v in originals.values())


def _file_bytes(tmp_path, ext: str, fmt: str) -> bytes:
    x = tone(8000)
    if fmt == "MP3":  # libsndfile writes MP3 to files only; reading one from memory needs its ID3 tag
        path = tmp_path / "x.mp3"
        soundfile.write(str(path), x, RATE, format="MP3")
        return b"ID3\x03\x00\x00\x00\x00\x00\x0a" + bytes(10) + path.read_bytes()
    rate = {"WVE": 8000, "XI": 44100}.get(fmt, RATE)
    return encode(x, fmt, "OPUS" if ext == "opus" else None, rate)


@pytest.mark.parametrize("ext", sorted(AUDIO_FORMATS))
def test_every_measured_suffix_decodes(tmp_path, ext):
    fmt = AUDIO_FORMATS[ext]
    assert fmt in soundfile.available_formats()
    spec = length_spec(f"audio:{ext}")
    assert spec.wants(ext) and spec.wants(f"16k.{ext}".split(".", 1)[1])
    data = _file_bytes(tmp_path, ext, fmt)
    frames, rate = audio_info(data, ext, len(data))
    info = soundfile.info(io.BytesIO(data))
    assert (frames, rate) == (info.frames, info.samplerate)
    decoded = decode_audio({"__key__": "k", f"x.{ext}": data})[f"x.{ext}"]
    assert decoded[0].shape == (1, frames) and decoded[1] == rate
    batch = collate_audio([{"__key__": "k", f"x.{ext}": decoded}])
    assert batch["audio_lengths"].tolist() == [frames]


@pytest.mark.parametrize("suffix", ["npy", "mat", "htk", "raw", "txt", "16k.pt"])
def test_suffixes_that_do_not_decode_are_refused_up_front(tmp_path, suffix):
    with pytest.raises(ValueError, match=f"'{suffix.rsplit('.', 1)[-1]}' is not an audio format"):
        length_spec(f"audio:{suffix}")
    shard = _shard(tmp_path / "s.tar", [{"__key__": "k", suffix: b"\x93NUMPY..."}])
    with pytest.raises(ValueError, match="decode='audio' reads"):
        index_shards([shard], length_from=f"audio:{suffix}", workers=1, progress=False)
    assert length_spec("audio:16K.FLAC").suffix == "16k.flac"


def test_collate_audio_says_why_there_is_no_audio():
    wav = encode(tone(100), "WAV", "PCM_16")
    with pytest.raises(ValueError, match="still bytes: pass decode='audio'"):
        collate_audio([{"__key__": "k", "sph": wav}])
    with pytest.raises(ValueError, match=r"none of its members \['npy'\] has an audio suffix"):
        collate_audio([{"__key__": "k", "npy": b"x"}])
