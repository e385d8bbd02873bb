"""``collate_packed`` returns float32 waveforms, as documented (issue 32, item 20): integer PCM is scaled to
[-1, 1) by its type's full scale, never concatenated raw next to float samples (int16 32767 beside 0.5), and
(T, D) features of different dtypes are refused rather than silently promoted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streambatch import collate_packed


def test_int16_and_float32_waveforms_come_out_float32_on_one_scale():
    loud = np.array([16384, -32768, 32767], dtype=np.int16)  # 0.5, -1.0, ~1.0 of full scale
    quiet = np.array([0.25, -0.5], dtype=np.float32)
    out = collate_packed([loud, quiet])
    audio = out["audio"]
    assert audio.dtype == torch.float32 and audio.shape == (1, 5)
    assert audio[0].tolist() == pytest.approx([0.5, -1.0, 32767 / 32768, 0.25, -0.5])
    assert out["cu_seqlens"].tolist() == [0, 3, 5]


@pytest.mark.parametrize("dtype, full", [(np.int16, 2**15), (np.int32, 2**31), (np.int8, 2**7)])
def test_integer_pcm_alone_is_scaled_too(dtype, full):
    x = np.array([full // 2, -full], dtype=np.int64).astype(dtype)
    out = collate_packed([x, x])
    assert out["audio"].dtype == torch.float32
    assert out["audio"][0].tolist() == pytest.approx([0.5, -1.0, 0.5, -1.0])


def test_unsigned_8_bit_pcm_is_centred():
    x = np.array([128, 0, 192], dtype=np.uint8)  # WAV's 8-bit PCM: 128 is silence
    assert collate_packed([x])["audio"][0].tolist() == pytest.approx([0.0, -1.0, 0.5])


def test_float64_waveforms_become_float32_unscaled():
    out = collate_packed([np.array([0.5, -0.25]), torch.tensor([0.125], dtype=torch.float16)])
    assert out["audio"].dtype == torch.float32
    assert out["audio"][0].tolist() == pytest.approx([0.5, -0.25, 0.125])


def test_decoded_int_audio_is_scaled_like_raw_waveforms():
    a = {"__key__": "a", "wav": (torch.tensor([[16384, -16384]], dtype=torch.int16), 16000)}
    b = {"__key__": "b", "wav": (torch.tensor([[0.25]], dtype=torch.float32), 16000)}
    out = collate_packed([a, b])
    assert out["audio"].dtype == torch.float32 and out["sample_rate"] == 16000
    assert out["audio"][0].tolist() == pytest.approx([0.5, -0.5, 0.25])


def test_features_of_different_dtypes_are_refused():
    with pytest.raises(ValueError, match=r"mixes dtypes .*float32.*int64|mixes dtypes .*int64.*float32"):
        collate_packed([np.zeros((3, 4), np.float32), np.zeros((2, 4), np.int64)])
    same = collate_packed([np.zeros((3, 4), np.float16), np.ones((2, 4), np.float16)])
    assert same["features"].dtype == torch.float16 and same["features"].shape == (5, 4)  # features keep their dtype
