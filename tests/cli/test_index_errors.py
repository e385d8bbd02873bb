"""Indexing errors name the fix, and every command they print works as pasted (issue 32, items 15, 16, 18).

- 15: samples whose json has no ``duration`` name ``--length-from audio`` (and the command that works);
- 16: glob patterns (``train-*.tar``) are expanded for local paths, and a directory means every shard under
  it, in ``streambatch index``, ``index_shards`` and ``StreamingBatches`` alike (the CLI's ``plan data/``
  always took one);
- 18: ``--length-from audio`` without ``--frames-per-second`` says the lengths are audio samples, and the
  ``streambatch plan`` it suggests next has a budget no clip exceeds; ``{0..1}`` written for
  ``{000000..000001}`` is recognised as a padding mistake, and the corrected command works.

Each printed command is taken out of the output and run through ``main`` (the console script's code path).
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import wave

import numpy as np
import pytest
import webdataset as wds

from streambatch.cli.main import main
from streambatch.streaming import StreamingBatches, index_shards


def commands(text: str) -> list[list[str]]:
    """Every ``streambatch ...`` command a text names between backticks or after 'next: ', as argv for main."""
    found = re.findall(r"`(streambatch [^`]+)`", text) + re.findall(r"^next: (streambatch .+)$", text, re.M)
    return [shlex.split(c)[1:] for c in found]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def wav(seconds: float, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.zeros(int(seconds * rate), np.int16).tobytes())
    return buf.getvalue()


def corpus(directory, json_fields: dict | None, shards: int = 2, per_shard: int = 5, rate: int = 16000,
           digits: int = 6) -> list[str]:
    """Shards of 2-3 s WAV clips at ``rate``, with a json member of ``json_fields`` (None: no json)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(1)
    paths, n = [], 0
    for s in range(shards):
        path = os.path.join(directory, f"train-{s:0{digits}d}.tar")
        with wds.TarWriter(path) as sink:
            for _ in range(per_shard):
                sample = {"__key__": f"u{n:05d}", "wav": wav(float(rng.uniform(2, 3)), rate)}
                if json_fields is not None:
                    sample["json"] = json.dumps(json_fields).encode()
                sink.write(sample)
                n += 1
        paths.append(path)
    return paths


# ---------------------------------------------------------------- 15: no duration field


def test_a_json_without_duration_names_length_from_audio(tmp_path, capsys):
    paths = corpus(tmp_path / "c", {"text": "hello"})
    pattern = str(tmp_path / "c" / "train-{000000..000001}.tar")
    with pytest.raises(ValueError, match=r"no field 'duration'.*'text'.*length_from='audio'"):
        index_shards(pattern, workers=1, progress=False)
    code, _, err = run(["index", pattern, "--no-progress"], capsys)
    assert code == 2 and "--length-from audio" in err and "KeyError" not in err
    (argv,) = commands(err)
    assert argv[:1] == ["index"] and "--length-from" in argv
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert StreamingBatches(paths, 400_000, 8).catalog.num_samples == 10


# ---------------------------------------------------------------- 16: globs and directories


def test_glob_patterns_are_expanded(tmp_path, capsys):
    paths = corpus(tmp_path / "c", {"duration": 3})
    glob = str(tmp_path / "c" / "train-*.tar")
    code, out, err = run(["index", glob, "--no-progress"], capsys)
    assert code == 0, err
    assert out.startswith("2 shards")
    ds = StreamingBatches(glob, 16, 8)
    assert list(ds.catalog.urls) == paths
    assert index_shards(str(tmp_path / "c" / "train-00000?.tar"), progress=False).shards == 2


def test_a_glob_that_matches_nothing_says_so(tmp_path):
    corpus(tmp_path / "c", {"duration": 3})
    with pytest.raises(FileNotFoundError, match=r"no file matches the pattern .*valid-\*\.tar"):
        StreamingBatches(str(tmp_path / "c" / "valid-*.tar"), 16, 8)


def test_a_directory_means_every_shard_under_it(tmp_path, capsys):
    paths = corpus(tmp_path / "data" / "part1", {"duration": 3}, shards=1)
    paths += corpus(tmp_path / "data" / "part2", {"duration": 3}, shards=1)
    top = str(tmp_path / "data")
    assert index_shards(top, progress=False).shards == 2
    ds = StreamingBatches(top + os.sep, 16, 8)
    assert sorted(ds.catalog.urls) == sorted(paths)
    assert run(["plan", top, "-t", "16"], capsys)[0] == 0
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="directory without .tar shards"):
        StreamingBatches(str(tmp_path / "empty"), 16, 8)


# ---------------------------------------------------------------- 18: units and padding


def test_audio_lengths_without_fps_are_named_and_the_next_plan_fits(tmp_path, capsys):
    corpus(tmp_path / "c", None, rate=16000)  # 2-3 s clips: 32,000-48,000 audio samples each
    pattern = str(tmp_path / "c" / "train-{000000..000001}.tar")
    code, out, err = run(["index", pattern, "--length-from", "audio", "--no-progress"], capsys)
    assert code == 0, err
    assert "audio samples" in out + err and "--frames-per-second" in out + err
    (argv,) = [c for c in commands(out) if c[0] == "plan"]
    budget = int(argv[argv.index("--max-batch-tokens") + 1])
    assert budget >= 48_000
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert "over budget" not in out


def test_frames_keep_the_usual_suggestion(tmp_path, capsys):
    corpus(tmp_path / "c", None)
    pattern = str(tmp_path / "c" / "train-{000000..000001}.tar")
    code, out, err = run(["index", pattern, "--length-from", "audio", "--fps", "50", "--no-progress"], capsys)
    assert code == 0 and "audio samples" not in out + err
    (argv,) = [c for c in commands(out) if c[0] == "plan"]
    assert argv[argv.index("--max-batch-tokens") + 1] == "16000"
    assert run(argv, capsys)[0] == 0


def test_unpadded_braces_are_named_a_padding_mistake(tmp_path, capsys):
    corpus(tmp_path / "c", {"duration": 3})
    wrong = str(tmp_path / "c" / "train-{0..1}.tar")
    code, _, err = run(["index", wrong, "--no-progress"], capsys)
    assert code == 2 and "train-000000.tar" in err and "{000000..000001}" in err
    (argv,) = commands(err)
    assert run(argv, capsys)[0] == 0
    with pytest.raises(FileNotFoundError, match=r"zero padding.*train-\{000000\.\.000001\}\.tar"):
        StreamingBatches(wrong, 16, 8)
    with pytest.raises(ValueError, match=r"zero padding.*train-\{000000\.\.000001\}\.tar"):
        index_shards(wrong, progress=False)
    ds = StreamingBatches(wrong.replace("{0..1}", "{000000..000001}"), 16, 8)
    assert ds.catalog.num_samples == 10
