"""Errors that suggest a command suggest one that works: each test follows the hint.

The command is taken out of the message (between backticks), run through the
command line's ``main`` in this process (the code path of the console script),
and then the call that failed is repeated and must succeed.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import wave

import numpy as np
import pytest
import webdataset as wds

from streambatch.cli.main import main
from streambatch.streaming import StreamingBatches


def hinted(message: str) -> list[str]:
    """The ``streambatch ...`` command a message names, as argv for ``main``."""
    found = re.search(r"`(streambatch [^`]+)`", message)
    assert found, f"no command in: {message}"
    argv = shlex.split(found.group(1))
    assert argv[0] == "streambatch"
    return argv[1:]


def follow(message: str, capsys) -> None:
    argv = hinted(message)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 0, f"the hinted `{' '.join(argv)}` failed: {err}"


def wav(seconds: float, rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.zeros(int(seconds * rate), np.int16).tobytes())
    return buf.getvalue()


def corpus(directory, kind: str, shards: int = 2, per_shard: int = 6) -> str:
    """Shards whose samples carry a json duration in seconds ("seconds"), an
    integer count ("counts"), or audio only ("audio"). Returns a brace pattern."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    n = 0
    for s in range(shards):
        with wds.TarWriter(os.path.join(directory, f"c-{s:03d}.tar")) as sink:
            for _ in range(per_shard):
                secs = float(rng.uniform(0.2, 1.0))
                sample = {"__key__": f"u{n:05d}", "wav": wav(secs)}
                if kind == "seconds":
                    sample["json"] = json.dumps({"duration": round(secs, 4)}).encode()
                elif kind == "counts":
                    sample["json"] = json.dumps({"duration": int(secs * 100)}).encode()
                sink.write(sample)
                n += 1
    return os.path.join(directory, f"c-{{000..{shards - 1:03d}}}.tar")


@pytest.mark.parametrize("kind, flags", [
    ("seconds", "--frames-per-second 50"),
    ("counts", None),
    ("audio", "--length-from audio --frames-per-second 50"),
])
def test_missing_sidecar_hint_indexes_the_shards(tmp_path, capsys, kind, flags):
    pattern = corpus(tmp_path / kind, kind)
    with pytest.raises(FileNotFoundError, match="no usable sidecar") as info:
        StreamingBatches(pattern, 2000, 8)
    argv = hinted(str(info.value))
    if flags:
        assert " ".join(argv).startswith(f"index {flags} "), argv
    else:
        assert "--frames-per-second" not in argv and "--length-from" not in argv, argv
    follow(str(info.value), capsys)
    ds = StreamingBatches(pattern, 2000, 8)
    assert sum(len(b) for b in ds) == 12


def test_hint_keeps_index_dir_and_length_source(tmp_path, capsys):
    pattern = corpus(tmp_path / "c", "seconds")
    idx = str(tmp_path / "idx dir")  # a space: the hint quotes it
    with pytest.raises(FileNotFoundError) as info:
        StreamingBatches(pattern, 2000, 8, index_dir=idx, length_from="json:duration", frames_per_second=100)
    argv = hinted(str(info.value))
    assert "--index-dir" in argv and argv[argv.index("--index-dir") + 1] == idx
    assert argv[argv.index("--frames-per-second") + 1] == "100"
    follow(str(info.value), capsys)
    StreamingBatches(pattern, 2000, 8, index_dir=idx, length_from="json:duration", frames_per_second=100)


def test_stale_sidecar_hint_forces_a_reindex(tmp_path, capsys):
    pattern = corpus(tmp_path / "c", "seconds")
    assert main(["index", pattern, "--frames-per-second", "50", "--no-progress"]) == 0
    capsys.readouterr()
    with pytest.raises(FileNotFoundError, match="stale") as info:  # other lengths asked for: the sidecars are stale
        StreamingBatches(pattern, 2000, 8, length_from="json:duration", frames_per_second=100)
    assert hinted(str(info.value))[:2] == ["index", "--force"]
    follow(str(info.value), capsys)
    StreamingBatches(pattern, 2000, 8, length_from="json:duration", frames_per_second=100)


def test_plan_hint_on_a_directory_of_shards(tmp_path, capsys):
    corpus(tmp_path / "data" / "demo", "seconds")  # shards one level down, as `streambatch demo --dir` leaves them
    top = str(tmp_path / "data")
    assert main(["plan", top, "-t", "2000"]) == 2
    err = capsys.readouterr().err
    assert "no usable sidecar" in err
    follow(err, capsys)
    assert main(["plan", top, "-t", "2000", "-w", "2"]) == 0
    out = capsys.readouterr().out
    assert "12 samples from 2 indexed shards (50 frames/s)" in out


def test_index_errors_name_the_command_that_works(tmp_path, capsys):
    seconds = corpus(tmp_path / "s", "seconds")
    assert main(["index", seconds, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "a fraction" in err and "--frames-per-second 50" in err
    follow(err, capsys)
    audio = corpus(tmp_path / "a", "audio")
    idx = str(tmp_path / "idx")
    assert main(["index", audio, "--index-dir", idx, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no .json member" in err and "choose another --length-from" in err
    argv = hinted(err)
    assert "--length-from" in argv and "--index-dir" in argv
    follow(err, capsys)
    StreamingBatches(audio, 2000, 8, index_dir=idx)


def test_a_missing_shard_is_no_such_file(tmp_path, capsys):
    pattern = corpus(tmp_path / "c", "counts")
    assert main(["index", pattern, "--no-progress"]) == 0
    capsys.readouterr()
    wider = pattern.replace("{000..001}", "{000..003}")
    with pytest.raises(FileNotFoundError, match="no such file") as info:
        StreamingBatches(wider, 2000, 8)
    assert "2 of 4 shards are missing" in str(info.value) and info.value.filename.endswith("c-002.tar")
    assert "sidecar" not in str(info.value)
    assert main(["plan", wider, "-t", "2000"]) == 2
    err = capsys.readouterr().err
    assert "c-002.tar: no such file" in err
    shutil.rmtree(tmp_path / "c")
    with pytest.raises(FileNotFoundError, match="no such file"):
        StreamingBatches(pattern, 2000, 8)


def test_reindexing_keeps_the_lengths_the_sidecars_were_made_with(tmp_path, capsys):
    from streambatch.streaming.shards.sidecar import read_meta, sidecar_path

    pattern = corpus(tmp_path / "c", "seconds")
    assert main(["index", pattern, "--frames-per-second", "50", "--no-progress"]) == 0
    assert main(["index", "--force", pattern, "--no-progress"]) == 0  # no flags: the recorded ones
    err = capsys.readouterr().err
    assert "lengths as the existing sidecars have them: --length-from json:duration --frames-per-second 50" in err
    first = pattern.replace("{000..001}", "000")
    assert read_meta(sidecar_path(first))["length_from"] == "json:duration*50/s"


@pytest.mark.parametrize("damage", ["no lengths array", "not an npz file"])
def test_a_broken_sidecar_names_the_command_that_rewrites_it(tmp_path, capsys, damage):
    from streambatch.streaming.shards.sidecar import sidecar_path

    pattern = corpus(tmp_path / "c", "seconds")
    idx = str(tmp_path / "idx")
    assert main(["index", pattern, "--frames-per-second", "50", "--no-progress", "--index-dir", idx]
                if damage == "no lengths array" else ["index", pattern, "--frames-per-second", "50", "--no-progress"]
                ) == 0
    capsys.readouterr()
    first = pattern.replace("{000..001}", "000")
    path = sidecar_path(first, idx if damage == "no lengths array" else None)
    if damage == "no lengths array":  # a readable meta: the hint repeats its length source and index dir
        with np.load(path) as z:
            kept = {k: z[k] for k in z.files if k != "lengths"}
        with open(path, "wb") as f:
            np.savez(f, **kept)
    else:  # nothing readable: the hint reads the shard beside it
        with open(path, "wb") as f:
            f.write(b"not a zip file at all")
    kw = {"index_dir": idx} if damage == "no lengths array" else {}
    with pytest.raises(Exception, match="re-index the shard with") as info:
        ds = StreamingBatches(pattern, 2000, 8, **kw)
        list(ds)
    argv = hinted(str(info.value))
    assert argv[:2] == ["index", "--force"] and "--frames-per-second" in argv, argv
    if kw:
        assert argv[argv.index("--index-dir") + 1] == idx
    follow(str(info.value), capsys)
    assert sum(len(b) for b in StreamingBatches(pattern, 2000, 8, **kw)) == 12
