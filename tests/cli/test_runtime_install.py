"""What the base install (no extras: no soundfile) can do: write, index, stream and decode WAV,
and run ``streambatch demo``; everything else names the extra to install.

soundfile is hidden by ``sys.modules["soundfile"] = None``, which makes ``import soundfile``
raise ImportError as it does where the package is not installed.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from streambatch.cli.corpus import make_shards
from streambatch.streaming import StreamingBatches, decode_audio, index_shards


def stream(paths, **kw) -> dict:
    ds = StreamingBatches(paths, 4000, 8, decode="audio", window_samples=12, **kw)
    return {s["__key__"]: s for batch in ds for s in batch}


def test_wav_corpus_streams_and_decodes_without_soundfile(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "soundfile", None)
        paths = make_shards(str(tmp_path), 2, 6, seed=3, sample_rate=8000, median_seconds=0.5,
                            speech="generated", audio_format="wav")
        index_shards(paths, frames_per_second=50, workers=1, progress=False)
        plain = stream(paths)
        with pytest.raises(ImportError, match=r"pip install 'streambatch\[audio\]'"):
            make_shards(str(tmp_path / "flac"), 1, 1, speech="generated", audio_format="flac")
    pytest.importorskip("soundfile")
    with_soundfile = stream(paths)  # the same bytes decoded by libsndfile
    assert sorted(plain) == sorted(with_soundfile) and len(plain) == 12
    for key, s in plain.items():
        audio, rate = s["wav"]
        ref, ref_rate = with_soundfile[key]["wav"]
        assert rate == ref_rate == 8000 and audio.dtype == ref.dtype and audio.shape == ref.shape
        assert np.array_equal(audio.numpy(), ref.numpy())


def test_other_audio_names_the_extra_without_soundfile(tmp_path, monkeypatch):
    sf = pytest.importorskip("soundfile")
    import io

    buf = io.BytesIO()
    sf.write(buf, np.zeros(800, np.float32), 8000, format="FLAC")
    monkeypatch.setitem(sys.modules, "soundfile", None)
    with pytest.raises(ImportError, match=r"decoding \.flac audio needs soundfile.*pip install 'streambatch\[audio\]'"):
        decode_audio({"__key__": "a", "flac": buf.getvalue()})


@pytest.mark.slow  # a subprocess: the whole demo as a user of the base install runs it
def test_demo_runs_without_soundfile(tmp_path):
    code = ("import sys; sys.modules['soundfile'] = None\n"
            "from streambatch.cli.main import main\n"
            "sys.exit(main(['demo', '--shards', '2', '--samples-per-shard', '8', '--workers', '1']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "MiB of WAV + JSON" in r.stdout and "decoding WAV" in r.stdout
    assert "every rank took the same number of steps" in r.stdout
