"""Streaming I/O under adversity (issue 11): sidecars rewritten while a job
runs, a low descriptor limit, same-size shard edits, hostile JSON / audio /
length functions, corrupt sidecars, and a decode that returns None. Every
failure must be one clear error naming the shard (or sidecar) and sample,
never a hang, a crash deep inside, or a silent loss."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

from streambatch.streaming import ShardError, StreamingBatches, index_shards, sidecar_path
from streambatch.streaming.io.reader import LocalReader
from streambatch.streaming.shards.sidecar import read_arrays, read_meta
from tests.support.corpus import index_corpus
from tests.support.shards import FPS, audio_bytes, write_corpus

BUDGET, CAP = 400, 12


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus([9, 12, 7, 11, 10, 8], seed=11, name="rel")
    return c.paths, c.expected


def make(paths, **kw):
    kw.setdefault("world_size", 1)
    kw.setdefault("rank", 0)
    kw.setdefault("verify", False)
    return StreamingBatches(paths, kw.pop("budget", BUDGET), kw.pop("cap", CAP), **kw)


def keys_of(batches):
    return [tuple(s["__key__"] for s in b) for b in batches]


def json_shard(path, values, suffix="json", extra=None) -> str:
    """One shard whose sample i has a ``json`` member ``values[i]`` (bytes, or
    a duration); ``extra`` adds members to every sample."""
    with wds.TarWriter(str(path)) as sink:
        for i, v in enumerate(values):
            data = v if isinstance(v, bytes) else json.dumps({"duration": v}).encode()
            sink.write({"__key__": f"utt{i:03d}", suffix: data, **(extra or {})})
    return str(path)


def one_line_naming(exc: BaseException, *words: str) -> None:
    msg = str(exc)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)


# ---------------------------------------------------------------- item 1: sidecars rewritten mid-job


def test_reindex_while_ranks_stream_changes_nothing(tmp_path):
    _, paths, expected = write_corpus(tmp_path, [8] * 10, seed=5)
    index_corpus(paths)
    ref = [keys_of(make(paths, window_samples=20, rank=r, world_size=2)) for r in range(2)]
    later = make(paths, window_samples=20, rank=0, world_size=2)
    later.set_epoch(1)
    ref_len1 = len(later)
    ds = [make(paths, window_samples=20, rank=r, world_size=2) for r in range(2)]
    n = len(ds[0])
    per_window = ds[0].epoch_summary().window_steps
    assert len(per_window) >= 3
    its = [iter(d) for d in ds]
    got = [[], []]
    # rank 0 runs a window ahead of rank 1 (it has planned window 1, rank 1 only window 0) ...
    for _ in range(per_window[0] + 1):
        got[0].append(tuple(s["__key__"] for s in next(its[0])))
    got[1].append(tuple(s["__key__"] for s in next(its[1])))
    # ... when another job re-indexes the shared corpus with other lengths (another frame rate)
    index_shards(paths, frames_per_second=FPS * 3, workers=1, progress=False, force=True)
    for r in range(2):
        got[r] += keys_of(its[r])
    assert len(got[0]) == len(got[1]) == n == len(ds[0]) == len(ds[1])
    assert got == ref  # immune: exactly the plan the job opened with, nothing lost or repeated
    for d in ds:  # later epochs too plan from the lengths the job opened with
        d.set_epoch(1)
    assert len(ds[0]) == len(ds[1]) == ref_len1
    fresh = make(paths, window_samples=20, rank=0, world_size=2)  # a new job sees the new lengths
    assert not np.array_equal(fresh.catalog.lengths(0), ds[0].catalog.lengths(0))


def test_shard_replaced_while_streaming_is_a_clear_error_on_every_rank(tmp_path):
    _, paths, _ = write_corpus(tmp_path / "a", [8] * 4, seed=1)
    _, other, _ = write_corpus(tmp_path / "b", [8] * 4, seed=2)
    index_corpus(paths)
    ds = [make(paths, window_samples=1000, rank=r, world_size=2, shuffle=False) for r in range(2)]
    for i, p in enumerate(paths):  # the shards themselves replaced and re-indexed before the first read
        os.replace(other[i], p)
    index_corpus(paths)
    for d in ds:
        with pytest.raises(ShardError, match=r"sidecar .*train-00000\d\.tar\.idx\.npz.* changed since this job "
                                             r"opened it"):
            list(d)


# ---------------------------------------------------------------- item 4: descriptors


def _limit_leaving(free: int) -> int:
    """An RLIMIT_NOFILE soft limit under which exactly ``free`` more
    descriptors can be opened (the limit bounds descriptor numbers)."""
    used = {int(x) for x in os.listdir("/proc/self/fd")}
    used = {fd for fd in used if os.path.exists(f"/proc/self/fd/{fd}")}  # drop listdir's own
    limit = 0
    while limit - len([fd for fd in used if fd < limit]) < free:
        limit += 1
    return limit


def test_reader_keeps_a_bounded_number_of_descriptors(corpus):
    paths, _ = corpus
    reader = LocalReader(max_open=2)
    want = {p: Path(p).read_bytes()[:1000] for p in paths}
    for _ in range(2):
        for p in paths:
            assert reader.read(p, 0, 1000) == want[p]
            assert len(reader._fds) <= 2
    reader.close()
    assert LocalReader().max_open == 64
    with pytest.raises(ValueError, match="max_open"):
        LocalReader(max_open=0)


def test_window_of_many_shards_under_a_low_descriptor_limit(tmp_path):
    _, paths, expected = write_corpus(tmp_path, [1] * 120, seed=9)
    index_corpus(paths)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for on_error in ("raise", "skip"):
        ds = make(paths, window_samples=10_000, on_error=on_error)  # one window holds all 120 shards
        limit = _limit_leaving(80)  # fewer than one per shard, more than the cache
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        try:
            got = [s["__key__"] for b in ds for s in b]
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert sorted(got) == sorted(expected) and ds.num_skipped == 0, on_error


def test_out_of_descriptors_is_not_skipped_as_a_broken_sample(corpus):
    paths, _ = corpus
    ds = make(paths, on_error="skip")
    it = iter(ds)
    reader = LocalReader()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (_limit_leaving(0), hard))  # every descriptor in use
    try:
        with pytest.raises(OSError, match="descriptors|Too many open files"):
            next(it)
        with pytest.raises(OSError, match="out of file descriptors.*ulimit") as info:
            reader.read(paths[0], 0, 512)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not isinstance(info.value, ShardError) and ds.num_skipped == 0


# ---------------------------------------------------------------- item 9: same-size edits


def _edit_mid_json(path: str) -> None:
    """Change one JSON duration in the middle of the shard, same size, mtime kept."""
    data = bytearray(Path(path).read_bytes())
    st = os.stat(path)
    mid = data.index(b'"duration": 0.', len(data) // 2 - 5000)
    assert 64 * 1024 < mid < len(data) - 64 * 1024  # outside the head/tail probe
    data[mid + 12] = ord("9")
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_same_size_edit_with_mtime_kept_is_caught_by_full_verification(tmp_path):
    _, paths, _ = write_corpus(tmp_path, [60, 5], seed=4)
    index_corpus(paths)
    assert "content" in read_meta(sidecar_path(paths[0]))
    _edit_mid_json(paths[0])
    make(paths)  # the cheap check trusts an unchanged size and mtime (documented)
    with pytest.raises(FileNotFoundError, match=r"stale sidecar: the shard's content changed.*--force"):
        make(paths, verify="full")
    index_corpus(paths, force=True)
    assert len(make(paths, verify="full")) > 0


def test_full_verification_of_streams(tmp_path):
    _, paths, _ = write_corpus(tmp_path, [5, 7], seed=1)
    pipes, idx = [f"pipe:cat {p}" for p in paths], str(tmp_path / "idx")
    index_shards(pipes, frames_per_second=FPS, index_dir=idx, workers=1, progress=False)
    index_corpus(paths)
    # the digest taken while scanning a stream is the file's
    assert read_meta(sidecar_path(pipes[1], idx))["content"] == read_meta(sidecar_path(paths[1]))["content"]
    assert sum(len(b) for b in make(pipes, index_dir=idx, verify="full")) == 12
    data = bytearray(Path(paths[1]).read_bytes())
    data[3000] ^= 1
    Path(paths[1]).write_bytes(data)
    make(pipes, index_dir=idx)  # a stream is not checked by default
    with pytest.raises(FileNotFoundError, match=r"pipe:cat .*train-000001\.tar: stale sidecar: the shard's content"):
        make(pipes, index_dir=idx, verify="full")


def test_same_size_edit_with_new_mtime_is_caught_by_the_cheap_check(tmp_path):
    _, paths, _ = write_corpus(tmp_path, [60], seed=4)
    index_corpus(paths)
    data = bytearray(Path(paths[0]).read_bytes())
    at = data.index(b'"duration": 0.')  # in the head probe
    data[at + 12] = ord("9")
    Path(paths[0]).write_bytes(data)
    os.utime(paths[0], ns=(1, 1))
    with pytest.raises(FileNotFoundError, match="content changed"):
        make(paths)


# ---------------------------------------------------------------- crashes with unclear errors


@pytest.mark.parametrize("value,fps", [(1e18, FPS), (1e19, None), (10**30, None), (2**62, None)])
def test_huge_json_durations(tmp_path, value, fps):
    path = json_shard(tmp_path / "big.tar", [5, value])
    length_from = "json:duration"
    with pytest.raises(ValueError) as info:
        index_shards([path], length_from=length_from, frames_per_second=fps, workers=1, progress=False)
    one_line_naming(info.value, "big.tar", "utt001")
    assert not isinstance(info.value, OverflowError)


def test_frame_rate_out_of_range(tmp_path):
    path = json_shard(tmp_path / "fps.tar", [0.5])
    with pytest.raises(ValueError, match=r"frames_per_second must be a finite number in \(0, 1e12\).*1e\+19"):
        index_shards([path], frames_per_second=1e19, workers=1, progress=False)


@pytest.mark.parametrize("fn", [lambda s: 10**30, lambda s: 10**400, lambda s: 1e300, lambda s: json.loads(s["nope"])])
def test_length_functions_that_overflow_or_raise(tmp_path, fn):
    path = json_shard(tmp_path / "fn.tar", [0.5, 0.7])
    for fps in (None, FPS):
        with pytest.raises(ValueError) as info:
            index_shards([path], length_from=fn, frames_per_second=fps, workers=1, progress=False)
        one_line_naming(info.value, "fn.tar", "utt000")


def test_deeply_nested_json(tmp_path):
    path = json_shard(tmp_path / "deep.tar", [0.5, b'{"duration": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"])
    with pytest.raises(ValueError) as info:
        index_corpus([path])
    one_line_naming(info.value, "deep.tar", "utt001")


def _wav_rate_zero() -> bytes:
    data = bytearray(audio_bytes(800, "wav", np.random.default_rng(0)))
    fmt = data.index(b"fmt ")
    struct.pack_into("<I", data, fmt + 12, 0)
    return bytes(data)


def _flac_rate_zero() -> bytes:
    data = bytearray(audio_bytes(800, "flac", np.random.default_rng(0)))
    info = data.index(b"fLaC") + 8
    bits = int.from_bytes(data[info + 10 : info + 18], "big") & ((1 << 44) - 1)  # rate (20 bits) := 0
    data[info + 10 : info + 18] = bits.to_bytes(8, "big")
    return bytes(data)


@pytest.mark.parametrize("fmt,data", [
    ("wav", _wav_rate_zero()), ("flac", _flac_rate_zero()),
    ("wav", audio_bytes(800, "wav", np.random.default_rng(1))[:30]),   # truncated in the header
    ("flac", audio_bytes(800, "flac", np.random.default_rng(1))[:20]),
], ids=["wav-rate-0", "flac-rate-0", "wav-truncated", "flac-truncated"])
@pytest.mark.parametrize("pipe", [False, True])
def test_broken_audio_headers(tmp_path, fmt, data, pipe):
    path = json_shard(tmp_path / "audio.tar", [0.5, 0.5])
    with wds.TarWriter(path) as sink:
        sink.write({"__key__": "good", fmt: audio_bytes(800, fmt, np.random.default_rng(2))})
        sink.write({"__key__": "bad", fmt: data})
    url = f"pipe:cat {path}" if pipe else path
    with pytest.raises(ValueError) as info:
        index_shards([url], length_from="audio", frames_per_second=FPS, index_dir=str(tmp_path / "idx"),
                     workers=1, progress=False)
    one_line_naming(info.value, "audio.tar", "'bad'")


def test_cli_reports_one_line_and_exit_2(tmp_path, capsys):
    from streambatch.cli.main import main

    path = json_shard(tmp_path / "cli.tar", [5, 1e19])
    assert main(["index", path, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cli.tar" in err and "utt001" in err, err


# ---------------------------------------------------------------- corrupt sidecars


def _sidecar_arrays(path):
    names = ("keys", "lengths", "offsets", "sizes")
    return dict(zip(names, read_arrays(sidecar_path(path), names)))


def _write_npz(target, arrays, meta, compressed=True):
    save = np.savez_compressed if compressed else np.savez
    with open(target, "wb") as f:
        save(f, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)


def _broken(corpus, tmp_path, edit, shard=1):
    """Copies of the corpus and its sidecars, ``edit(arrays, meta)`` applied to one sidecar."""
    import shutil

    paths = []
    for p in corpus[0]:
        q = str(tmp_path / os.path.basename(p))
        shutil.copy2(p, q)
        shutil.copy2(sidecar_path(p), sidecar_path(q))
        paths.append(q)
    arrays, meta = _sidecar_arrays(paths[shard]), read_meta(sidecar_path(paths[shard]))
    meta["url"] = paths[shard]
    edit(arrays, meta)
    _write_npz(sidecar_path(paths[shard]), arrays, [meta] if meta.pop("as_list", False) else meta)
    return paths


@pytest.mark.parametrize("name,edit,words", [
    ("fractional", lambda a, m: a.update(lengths=a["lengths"] + 0.5), ["lengths", "integer"]),
    ("string", lambda a, m: a.update(lengths=a["lengths"].astype(str)), ["lengths", "integer"]),
    ("nan", lambda a, m: a.update(lengths=np.where(np.arange(a["lengths"].size) == 2, np.nan, 1.0)), ["lengths"]),
    ("negative", lambda a, m: a["lengths"].__setitem__(3, -5), ["-5", "'train/s"]),
    ("too long", lambda a, m: a["lengths"].__setitem__(3, 2**62), ["'train/s"]),
    ("short", lambda a, m: a.update(lengths=a["lengths"][:-1]), ["lengths"]),
    ("2d", lambda a, m: a.update(lengths=a["lengths"][:, None]), ["lengths"]),
    ("no digest", lambda a, m: m.pop("digest"), ["digest"]),
    ("samples", lambda a, m: m.update(samples="12"), ["samples"]),
    ("version", lambda a, m: m.update(version=[]), ["version"]),
    ("meta list", lambda a, m: m.update(as_list=True), ["meta", "list"]),
])
def test_corrupt_sidecar_lengths_or_meta_name_the_sidecar(corpus, tmp_path, name, edit, words):
    paths = _broken(corpus, tmp_path, edit)
    with pytest.raises(FileNotFoundError) as info:
        make(paths)
    one_line_naming(info.value, sidecar_path(paths[1]), *words)


@pytest.mark.parametrize("name,edit,words", [
    ("float offsets", lambda a, m: a.update(offsets=a["offsets"].astype(float)), ["offsets", "integer"]),
    ("huge size", lambda a, m: a["sizes"].__setitem__(2, 2**40), ["'train/s", "bytes"]),
    ("negative offset", lambda a, m: a["offsets"].__setitem__(0, -512), ["'train/s"]),
    ("overlap", lambda a, m: a["offsets"].__setitem__(2, a["offsets"][1]), ["'train/s"]),
    ("keys", lambda a, m: a.update(keys=np.arange(a["keys"].size)), ["keys"]),
])
def test_corrupt_sidecar_tables_are_shard_errors_or_skipped(corpus, tmp_path, name, edit, words):
    def resigned(a, m):  # the digest recomputed, so only the validation can catch it
        from streambatch.streaming.shards.sidecar import _digest

        edit(a, m)
        with contextlib.suppress(Exception):
            m["digest"] = _digest(a)

    paths = _broken(corpus, tmp_path, resigned)
    try:
        ds = make(paths)
    except FileNotFoundError as exc:  # caught when opening, from the npz headers
        one_line_naming(exc, sidecar_path(paths[1]), *words[:1])
        return
    with pytest.raises(ShardError) as info:
        list(ds)
    one_line_naming(info.value, sidecar_path(paths[1]), *words)
    ds = make(paths, on_error="skip")
    got = [s["__key__"] for b in ds for s in b]
    assert len(got) + ds.num_skipped == ds.catalog.num_samples and ds.num_skipped == ds.catalog.counts[1]


def test_npz_header_declaring_a_huge_shape(corpus, tmp_path):
    def huge(arrays, meta):
        arrays["lengths"] = arrays["lengths"]  # replaced below, in the zip

    paths = _broken(corpus, tmp_path, huge)
    side = sidecar_path(paths[1])
    arrays, meta = _sidecar_arrays(paths[1]), read_meta(side)
    with zipfile.ZipFile(side, "w") as z:
        for name, arr in [("meta", np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)), *arrays.items()]:
            buf = io.BytesIO()
            if name == "lengths":
                np.lib.format.write_array_header_1_0(buf, {"descr": "<i8", "fortran_order": False, "shape": (2**40,)})
                buf.write(arr.tobytes())
            else:
                np.lib.format.write_array(buf, arr)
            z.writestr(name + ".npy", buf.getvalue())
    with pytest.raises(FileNotFoundError) as info:
        make(paths)
    one_line_naming(info.value, side, "lengths")


# ---------------------------------------------------------------- decode returning None


def test_decode_returning_none_is_an_error_or_a_counted_skip(corpus):
    paths, expected = corpus
    with pytest.raises(ShardError, match=r"decode returned None for sample 'train/s\d+' of shard .*train-"):
        list(make(paths, decode=lambda s: None))
    ds = make(paths, decode=lambda s: None if s["__key__"].endswith("3") else s, on_error="skip")
    got = [s["__key__"] for b in ds for s in b]
    assert sorted(got + [k for k in expected if k.endswith("3")]) == sorted(expected)
    assert ds.num_skipped == sum(k.endswith("3") for k in expected)
