"""A demo corpus of WebDataset audio shards (for the README and benchmarks).

Utterance durations follow a log-normal distribution (median 4 s, clipped to
[0.5 s, 20 s]), roughly the shape of read-speech corpora. Audio is speech
from espeak-ng when it is installed (``speech="auto"``), otherwise generated
pseudo-speech: a harmonic voice with a wandering pitch, syllable-rate
envelope and a little noise. Each sample holds an audio member (``flac`` or
``wav``) and a ``json`` member with ``duration`` (seconds), ``text``,
``sample_rate`` and ``speaker``. Shards are bit-for-bit reproducible from
the seed.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tempfile
import wave
from collections.abc import Callable

import numpy as np

_WORDS = ("the quick brown fox jumps over a lazy dog while seven bright stars rise above quiet hills "  # noqa: SIM905 (a sentence reads better)
          "and distant rivers carry old songs toward morning light under silver clouds").split()
_MTIME = 1_700_000_000  # fixed member mtimes: identical bytes on every run


def durations(n: int, rng: np.random.Generator, median: float = 4.0, sigma: float = 0.6,
              low: float = 0.5, high: float = 20.0) -> np.ndarray:
    """(n,) float64 utterance durations in seconds."""
    return np.clip(rng.lognormal(np.log(median), sigma, n), low, high)


def pseudo_speech(seconds: float, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """(T,) float32 voice-like audio: harmonics of a drifting f0, ~4 Hz syllables."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    f0 = rng.uniform(90, 220) * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.2, 0.6) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 6.3)), 0, None) ** 0.5
    x = 0.2 * voice * envelope + 0.005 * rng.standard_normal(t.shape[0])
    return x.astype(np.float32)


def espeak_speech(text: str, voice_speed: int) -> tuple[np.ndarray, int]:
    """(float32 audio, sample_rate) spoken by espeak-ng."""
    from ..streaming.formats.audio import read_pcm_wav

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "u.wav")
        subprocess.run(["espeak-ng", "-s", str(voice_speed), "-w", path, text], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(path, "rb") as f:
            x, sr = read_pcm_wav(f.read(), "wav")  # espeak-ng writes 16-bit PCM
    return x[:, 0], sr


def has_soundfile() -> bool:
    """Is soundfile (the ``audio`` extra, needed to write FLAC) installed?"""
    try:
        import soundfile  # noqa: F401
    except ImportError:
        return False
    return True


def encode(audio: np.ndarray, sample_rate: int, audio_format: str) -> bytes:
    """(T,) float32 audio in [-1, 1] as a 16-bit ``wav`` (standard library) or ``flac`` (soundfile) file."""
    buf = io.BytesIO()
    if audio_format == "wav":
        pcm = np.clip(np.round(audio * 32768.0), -32768, 32767).astype("<i2")
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(sample_rate)
            w.writeframes(pcm.tobytes())
        return buf.getvalue()
    try:
        import soundfile
    except ImportError:
        from ..streaming.formats.audio import AUDIO_EXTRA

        raise ImportError(f"writing {audio_format.upper()} needs soundfile: {AUDIO_EXTRA} "
                          "(or write WAV, which needs nothing more)") from None
    soundfile.write(buf, audio, sample_rate, format=audio_format.upper(), subtype="PCM_16")
    return buf.getvalue()


def make_shards(out_dir: str, n_shards: int = 8, samples_per_shard: int = 100, seed: int = 0, *,
                sample_rate: int = 16000, audio_format: str = "flac", speech: str = "auto",
                median_seconds: float = 4.0, prefix: str = "demo",
                progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Write ``n_shards`` tar shards of ``samples_per_shard`` utterances each
    to ``out_dir/{prefix}-000000.tar`` ... and return their paths.

    speech: ``"auto"`` (espeak-ng if installed, else generated), ``"espeak"``
    or ``"generated"``. audio_format: ``"flac"`` (needs soundfile, the ``audio``
    extra) or ``"wav"`` (the standard library's ``wave``). progress: called
    as ``progress(shards written, n_shards)`` after each shard.
    """
    import webdataset as wds

    from ..core.validation import check_int

    n_shards = check_int("n_shards", n_shards, 1)
    samples_per_shard = check_int("samples_per_shard", samples_per_shard, 1)
    sample_rate = check_int("sample_rate", sample_rate, 1000)
    if audio_format not in ("flac", "wav"):
        raise ValueError(f"audio_format must be 'flac' or 'wav', got {audio_format!r}")
    if speech not in ("auto", "espeak", "generated"):
        raise ValueError(f"speech must be 'auto', 'espeak' or 'generated', got {speech!r}")
    have_espeak = shutil.which("espeak-ng") is not None
    if speech == "espeak" and not have_espeak:
        raise ValueError("speech='espeak' needs espeak-ng on PATH (e.g. apt-get install espeak-ng); "
                         "use speech='generated'")
    use_espeak = have_espeak and speech != "generated"
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    pattern = os.path.join(out_dir, f"{prefix}-%06d.tar")
    paths = [pattern % i for i in range(n_shards)]
    n = 0
    for done, path in enumerate(paths, 1):
        with wds.TarWriter(path, mtime=_MTIME) as sink:
            for seconds in durations(samples_per_shard, rng, median=median_seconds):
                words = max(1, int(round(seconds * 2.5)))
                text = " ".join(rng.choice(_WORDS, words))
                speaker = int(rng.integers(0, 50))
                if use_espeak:
                    audio, sr = espeak_speech(text, int(rng.integers(140, 190)))
                else:
                    audio, sr = pseudo_speech(seconds, sample_rate, rng), sample_rate
                meta = {"duration": round(audio.shape[0] / sr, 6), "text": text, "sample_rate": sr,
                        "speaker": speaker}
                sink.write({"__key__": f"utt{n:09d}", audio_format: encode(audio, sr, audio_format),
                            "json": json.dumps(meta).encode()})
                n += 1
        if progress is not None:
            progress(done, n_shards)
    return paths
