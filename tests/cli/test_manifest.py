"""Reading lengths from .npy, text, JSON lines and JSON files (plain and gzip'd)."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.cli.manifest import read_lengths
from tests.support.helpers import examples


def write(path, text: str, gz: bool = False):
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


# ---------------------------------------------------------------- formats


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=50), st.sampled_from(["npy", "txt", "jsonl", "json"]),
       st.booleans())
@settings(max_examples=examples(40), deadline=None)
def test_integer_lengths_round_trip_through_every_format(tmp_path_factory, lengths, fmt, gz):
    path = tmp_path_factory.mktemp("m") / f"lengths.{fmt}"
    if fmt == "npy":
        np.save(path, np.array(lengths, dtype=np.int64))
        if gz:
            data = path.read_bytes()
            with gzip.open(path, "wb") as f:
                f.write(data)
    elif fmt == "txt":
        write(path, "\n".join(map(str, lengths)) + "\n", gz)
    elif fmt == "jsonl":
        write(path, jsonl({"id": i, "num_frames": x} for i, x in enumerate(lengths)), gz)
    else:
        write(path, json.dumps(lengths), gz)
    field = "num_frames" if fmt == "jsonl" else None
    got = read_lengths(path, field=field)
    assert got.dtype == np.int64
    assert got.tolist() == lengths


@given(st.lists(st.floats(0, 60, allow_nan=False), min_size=1, max_size=50), st.sampled_from([50, 100, 16000]))
@settings(max_examples=examples(40), deadline=None)
def test_seconds_become_ceil_of_frames_like_the_indexer(tmp_path_factory, seconds, fps):
    path = tmp_path_factory.mktemp("m") / "cuts.jsonl"
    write(path, jsonl({"id": f"c{i}", "duration": s} for i, s in enumerate(seconds)))
    want = [max(0, math.ceil(s * fps - 1e-6)) for s in seconds]  # LengthSpec.to_length's rule
    assert read_lengths(path, frames_per_second=fps).tolist() == want


def test_tolerance_keeps_exact_frame_counts(tmp_path):
    path = write(tmp_path / "d.txt", "0.07\n1.0\n0.0\n")
    assert read_lengths(path, frames_per_second=100).tolist() == [7, 100, 0]


def test_lhotse_cuts_gzipped(tmp_path):
    cuts = [{"id": "a", "start": 0.0, "duration": 1.5, "channel": 0, "supervisions": [{"duration": 1.2}],
             "type": "MonoCut"},
            {"id": "b", "start": 0.0, "duration": 3.02, "channel": 0, "supervisions": [{"duration": 3.0}],
             "type": "MonoCut"}]
    path = write(tmp_path / "cuts.jsonl.gz", jsonl(cuts), gz=True)
    assert read_lengths(path, frames_per_second=50).tolist() == [75, 151]
    assert read_lengths(path, field="supervisions.0.duration", frames_per_second=50).tolist() == [60, 150]


def test_voxcpm_style_audio_duration_and_blank_lines(tmp_path):
    text = '{"audio": "a.wav", "text": "hi", "audio_duration": 2.0}\n\n{"audio": "b.wav", "audio_duration": 0.5}\n'
    assert read_lengths(write(tmp_path / "train.jsonl", text), frames_per_second=50).tolist() == [100, 25]


def test_literal_dotted_key_wins_over_nesting(tmp_path):
    path = write(tmp_path / "m.jsonl", jsonl([{"a.b": 3, "a": {"b": 9}}]))
    assert read_lengths(path, field="a.b").tolist() == [3]


def test_text_skips_comments_and_blanks_and_keeps_big_integers_exact(tmp_path):
    big = 2**53 + 1  # float64 would round it
    path = write(tmp_path / "l.txt", f"# lengths\n\n 5 \n{big}\n7\n")
    assert read_lengths(path).tolist() == [5, big, 7]


def test_float_npy_needs_fps_unless_whole(tmp_path):
    np.save(tmp_path / "whole.npy", np.array([1.0, 2.0]))
    assert read_lengths(tmp_path / "whole.npy").tolist() == [1, 2]
    np.save(tmp_path / "sec.npy", np.array([1.5, 2.0], dtype=np.float32))
    assert read_lengths(tmp_path / "sec.npy", frames_per_second=50).tolist() == [75, 100]
    with pytest.raises(ValueError, match=r"element 0: 1.5 is fractional.*--frames-per-second"):
        read_lengths(tmp_path / "sec.npy")


def test_column_vector_npy_is_accepted(tmp_path):
    np.save(tmp_path / "col.npy", np.array([[3], [4]], dtype=np.int32))
    assert read_lengths(tmp_path / "col.npy").tolist() == [3, 4]


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name, content, field, fps, match", [
    ("l.txt", "1\n2\nabc\n", None, None, r"l.txt line 3: 'abc' is not a number"),
    ("l.txt", "1\n-2\n", None, None, r"line 2: -2 is negative"),
    ("l.txt", "1\n2.5\n", None, None, r"line 2: 2.5 is fractional.*--frames-per-second"),
    ("l.txt", "1\nnan\n", None, 50.0, r"line 2: nan is not a valid length"),
    ("l.txt", "1\n2\n", "duration", None, r"--field only applies to JSON"),
    ("l.txt", "\n# nothing\n", None, None, r"holds no lengths"),
    ("c.jsonl", '{"duration": 1}\n{"dur": 2}\n', None, None, r"c.jsonl line 2: no field 'duration'"),
    ("c.jsonl", '{"id": 1, "start": 0}\n', None, None,
     r"line 1: no duration or audio_duration field \(keys: id, start\); pass --field"),
    ("c.jsonl", '{"duration": 1}\n{"duration": \n', None, None, r"c.jsonl line 2: invalid JSON"),
    ("c.jsonl", '{"duration": "long"}\n', None, None, r"line 1, field 'duration': 'long' is not a number"),
    ("c.jsonl", '{"duration": 1}\n\n{"duration": 2.5}\n', None, None, r"line 3, field 'duration': 2.5 is fractional"),
    ("c.json", "[]", None, None, r"non-empty array"),
    ("c.json", '[1, 2', None, None, r"invalid JSON"),
    ("c.json", '[1, true]', None, None, r"element 1: True is not a number"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 12 else None)
def test_malformed_content_names_file_and_line(tmp_path, name, content, field, fps, match):
    with pytest.raises(ValueError, match=match):
        read_lengths(write(tmp_path / name, content), field=field, frames_per_second=fps)


def test_unreadable_inputs(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_lengths(tmp_path / "missing.npy")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        read_lengths(tmp_path)
    (tmp_path / "bin.dat").write_bytes(b"\x00\xff\xfe" * 10)
    with pytest.raises(ValueError, match="neither a .npy array nor UTF-8 text"):
        read_lengths(tmp_path / "bin.dat")
    (tmp_path / "bad.gz").write_bytes(gzip.compress(b"1\n2\n")[:-6])
    with pytest.raises(ValueError, match="corrupt gzip"):
        read_lengths(tmp_path / "bad.gz")
    np.save(tmp_path / "s.npy", np.array(["a", "b"]))
    with pytest.raises(ValueError, match="must be numbers"):
        read_lengths(tmp_path / "s.npy")
    np.save(tmp_path / "m.npy", np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"1-D array, got shape \(2, 3\)"):
        read_lengths(tmp_path / "m.npy")
    with pytest.raises(ValueError, match="frames per second must be"):
        read_lengths(tmp_path / "m.npy", frames_per_second=0)
