"""Tars written by real tools with members that are not plain files: sparse
members (GNU old style, pax 0.0/0.1/1.0, bsdtar's default), GNU incremental
dumps ('D' members), multi-volume continuations ('M'), volume labels ('V')
and other types whose data must be skipped. The reference for bytes is
Python's tarfile (``TarFile.extractfile``); damaged sparse maps must be a
``ShardError``, never wrong bytes, a hang or an unbounded allocation."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streambatch.streaming import ShardError, StreamingBatches, index_shards
from streambatch.streaming.formats.tar import TarScanner
from streambatch.streaming.formats.tar_samples import parse_sample, sample_groups
from tests.streaming.formats.test_tar_fuzz import URL, Stream, bounded, check_scan, finish, member, pax, record
from tests.support.helpers import examples

GNU_TAR = shutil.which("tar")
FRAMES = 400_000  # 25 s at 16 kHz: 800,044 bytes of 16-bit WAV, mostly silence
needs_gnu = pytest.mark.skipif(GNU_TAR is None, reason="GNU tar is not installed")

# (tool, arguments before the file list): every sparse encoding the two tools write
SPARSE_WRITERS = {
    "gnu-oldgnu": ("tar", ["--sparse", "--format=gnu"]),
    "gnu-pax-0.0": ("tar", ["--sparse", "--format=posix", "--sparse-version=0.0"]),
    "gnu-pax-0.1": ("tar", ["--sparse", "--format=posix", "--sparse-version=0.1"]),
    "gnu-pax-1.0": ("tar", ["--sparse", "--format=posix", "--sparse-version=1.0"]),
    "bsdtar": ("bsdtar", []),  # libarchive stores holes as pax 1.0 sparse by default
    "bsdtar-pax": ("bsdtar", ["--format=pax"]),
}


# ---------------------------------------------------------------- files with holes


def write_holey(path, data: bytes, block: int = 4096) -> None:
    """Write ``data`` with every all-zero ``block``-aligned run left as a hole."""
    with open(path, "wb") as f:
        for at in range(0, len(data), block):
            chunk = data[at : at + block]
            if chunk.strip(b"\0"):
                f.seek(at)
                f.write(chunk)
        f.truncate(len(data))


def silent_wav(frames: int, bursts: list[tuple[int, int]]) -> bytes:
    """A real 16 kHz 16-bit WAV of ``frames`` frames, silent but for tone bursts (start, length)."""
    x = np.zeros(frames, np.float32)
    for start, n in bursts:
        x[start : start + n] = 0.3 * np.sin(np.arange(n) / 7.0)
    buf = io.BytesIO()
    soundfile.write(buf, x, 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def holey_dir(tmp_path_factory):
    """Three samples of a WAV and a json member each. utt0: 25 s holding two
    bursts of sound (8 KiB stored of 800 KB); utt1: 25 s with 50 bursts (past
    the 4 map slots of a GNU header: extension blocks); utt2: 0.5 s of sound,
    no holes. Skips when the filesystem keeps no holes."""
    d = tmp_path_factory.mktemp("holey")
    src = d / "src"
    src.mkdir()
    files = {
        "utt0.wav": silent_wav(FRAMES, [(0, 3000), (200_000, 2000)]),
        "utt1.wav": silent_wav(FRAMES, [(8000 * i, 2048) for i in range(50)]),
        "utt2.wav": silent_wav(8000, [(0, 8000)]),
    }
    for name, data in list(files.items()):
        write_holey(src / name, data)
        meta = name.replace(".wav", ".json")
        files[meta] = b'{"duration": %d}' % len(data)
        (src / meta).write_bytes(files[meta])
    if os.stat(src / "utt0.wav").st_blocks * 512 >= len(files["utt0.wav"]):
        pytest.skip("this filesystem does not keep holes")
    names = sorted(p.name for p in src.iterdir())
    return d, src, names, files


def make_sparse_tar(holey_dir, writer: str) -> str:
    d, src, names, _ = holey_dir
    tool, args = SPARSE_WRITERS[writer]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    out = d / f"{writer}.tar"
    if not out.exists():
        subprocess.run([tool, *args, "-cf", str(out), "-C", str(src), *names], check=True)
    return str(out)


def tarfile_members(path: str) -> dict[str, bytes]:
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf if m.isreg()}


def sparse_names(path: str) -> set[str]:
    with tarfile.open(path) as tf:
        return {m.name for m in tf if m.sparse is not None}


@pytest.mark.parametrize("writer", sorted(SPARSE_WRITERS))
def test_sparse_members_read_like_tarfile(holey_dir, writer):
    path = make_sparse_tar(holey_dir, writer)
    # the test proves something only if the tool stored the holey files as sparse members
    assert sparse_names(path) == {"utt0.wav", "utt1.wav"}, writer
    ref = tarfile_members(path)
    assert ref == holey_dir[3]
    with open(path, "rb") as f:
        data = f.read()
    for stream in (False, True):  # seeking from header to header, and a pipe
        f = io.BufferedReader(Stream(data)) if stream else io.BytesIO(data)
        got = {f"{s.key}.{k}": v for s in sample_groups(TarScanner(f, URL), lambda suffix: -1)
               for k, v in s.members.items()}
        assert got == ref, (writer, stream)
    # a head of a sparse member is the head of the real file
    heads = {s.key: s.members["wav"] for s in sample_groups(TarScanner(io.BytesIO(data), URL),
                                                            lambda suffix: 5000 if suffix == "wav" else None)}
    assert heads == {k: ref[f"{k}.wav"][:5000] for k in ("utt0", "utt1", "utt2")}
    # parse_sample on one sample's bytes, as StreamingBatches reads them
    with open(path, "rb") as f:
        samples = list(sample_groups(TarScanner(f, path), lambda suffix: None))
    assert [s.key for s in samples] == ["utt0", "utt1", "utt2"]
    assert samples[0].sizes == {"json": len(ref["utt0.json"]), "wav": 800_044}
    for s in samples:
        got = parse_sample(data[s.offset : s.end], path, s.offset, s.key)
        assert got == {"__key__": s.key, "__url__": path, "json": ref[f"{s.key}.json"], "wav": ref[f"{s.key}.wav"]}


@pytest.mark.parametrize("writer", ["gnu-oldgnu", "gnu-pax-0.0", "gnu-pax-1.0", "bsdtar"])
def test_sparse_shard_indexes_and_streams_real_lengths(holey_dir, writer, tmp_path):
    path = make_sparse_tar(holey_dir, writer)
    shards = [str(tmp_path / f"shard-{i:03d}.tar") for i in range(2)]
    for s in shards:
        shutil.copy(path, s)
    ref = tarfile_members(path)
    summary = index_shards(shards, length_from="audio", workers=1, progress=False)
    assert summary.samples == 6 and summary.total_length == 2 * (FRAMES + FRAMES + 8000)
    ds = StreamingBatches(shards, 10**6, 4, world_size=1, rank=0)
    got = [s for b in ds for s in b]
    assert sorted((s["__url__"], s["__key__"]) for s in got) == sorted((u, k) for u in shards
                                                                       for k in ("utt0", "utt1", "utt2"))
    for s in got:
        assert s["wav"] == ref[s["__key__"] + ".wav"] and s["json"] == ref[s["__key__"] + ".json"]
        assert soundfile.info(io.BytesIO(s["wav"])).frames == (8000 if s["__key__"] == "utt2" else FRAMES)


def test_sparse_member_reread_when_its_header_runs_past_the_head(tmp_path):
    # A WAV whose sample count sits in a fact chunk after 800 KB of data (a codec
    # without samples-per-block): indexing reads a 64 KiB head, then the whole
    # member again (``read_member``), rebuilt from its sparse map.
    src = tmp_path / "src"
    src.mkdir()
    data = bytearray(silent_wav(FRAMES, [(0, 3000)]))
    data[20:22] = (0x0055).to_bytes(2, "little")  # MPEG layer 3: no samples-per-block rule
    data += b"fact" + (4).to_bytes(4, "little") + (123_456).to_bytes(4, "little")
    data[4:8] = (len(data) - 8).to_bytes(4, "little")
    write_holey(src / "u.wav", bytes(data))
    shard = tmp_path / "s.tar"
    if GNU_TAR is None:
        pytest.skip("GNU tar is not installed")
    subprocess.run(["tar", "--sparse", "--format=gnu", "-cf", str(shard), "-C", str(src), "u.wav"], check=True)
    assert sparse_names(str(shard)) == {"u.wav"}
    summary = index_shards([str(shard)], length_from="audio", workers=1, progress=False)
    assert summary.total_length == 123_456


# ---------------------------------------------------------------- members whose data is not a file


def _walk(path: str) -> list[tuple[str, dict[str, bytes]]]:
    with open(path, "rb") as f:
        return [(s.key, s.members) for s in sample_groups(TarScanner(f, path), lambda suffix: -1)]


@pytest.fixture()
def tree(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    files = {"d/a.json": b'{"duration": 1.5}', "d/sub/b.json": b'{"duration": 2.5}',
             "d/sub/b.txt": bytes(range(256)) * 12, "d/big.txt": b"x" * 30000}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path, files


def _samples(files: dict[str, bytes], *names: str) -> list[tuple[str, dict[str, bytes]]]:
    out: dict[str, dict[str, bytes]] = {}
    for name in names:
        key, suffix = name.rsplit(".", 1)
        out.setdefault(key, {})[suffix] = files[name]
    return list(out.items())


@needs_gnu
@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_gnu_incremental_dump_indexes(tree, fmt):
    root, files = tree
    shard = root / f"inc-{fmt}.tar"
    subprocess.run(["tar", f"--format={fmt}", f"--listed-incremental={root / 'snap'}", "-cf", str(shard),
                    "-C", str(root), "d"], check=True)
    with tarfile.open(shard) as tf:
        types = {m.type for m in tf}
    if fmt == "gnu":
        assert b"D" in types  # dump directories, whose data lists the directory
    got = dict(_walk(str(shard)))
    # Names as GNU tar lists them: its incremental headers keep atime/ctime where ustar has the
    # name prefix; GNU tar, libarchive and Go read the name alone (Python's tarfile prepends them).
    listed = subprocess.run(["tar", "-tf", str(shard)], check=True, capture_output=True, text=True).stdout.split()
    assert sorted(k for k in got) == sorted({n.rsplit(".", 1)[0] for n in listed if "." in n.rsplit("/", 1)[-1]})
    assert got == dict(_samples(files, "d/a.json", "d/big.txt", "d/sub/b.json", "d/sub/b.txt"))
    summary = index_shards([str(shard)], length_from=lambda s: sum(map(len, s.values())), workers=1,
                           progress=False)
    assert summary.samples == 3 and summary.total_length == sum(map(len, files.values()))


@needs_gnu
def test_multi_volume_and_label(tree):
    root, files = tree
    vols = [str(root / f"v{i}.tar") for i in range(3)]
    subprocess.run(["tar", "-M", "-L", "20", "-cf", vols[0], "-f", vols[1], "-f", vols[2], "-C", str(root), "d"],
                   check=True)
    with tarfile.open(vols[1]) as tf:
        first = tf.next()
    assert first.type == b"M"  # the tail of a member cut at the end of volume 0
    # volume 0 ends inside that member: truncated, not a silent short sample
    with pytest.raises(ShardError, match="truncated"):
        _walk(vols[0])
    # volume 1: the continuation's data is skipped as tarfile skips it; the members after it read
    ref = [(k, m) for k, m in _samples(files, *sorted(tarfile_members(vols[1])))]
    assert _walk(vols[1]) == ref and ref
    label = str(root / "label.tar")
    subprocess.run(["tar", "-V", "MY LABEL", "-cf", label, "-C", str(root), "d"], check=True)
    assert sorted(_walk(label)) == sorted(_samples(files, *files))


def _typed(name: str, typ: bytes, data: bytes) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.type, ti.size = typ, len(data)
    return ti.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


def test_data_of_every_unknown_member_type_is_skipped():
    # 'D' dump directory, 'N' old GNU names, 'V' label, 'M' continuation, 'Q' a type no one defines:
    # tarfile skips their data; '7' (contiguous file) is a regular file.
    junk = bytes(range(256)) * 5  # data that is not a tar header (a "bad checksum" if read as one)
    body = b"".join(_typed(f"x{t.decode()}", t, junk) + member(f"k{i}.json", b'{"n": %d}' % i)
                    for i, t in enumerate([b"D", b"N", b"V", b"M", b"Q"]))
    body += _typed("c.txt", tarfile.CONTTYPE, b"contiguous") + _typed("l.json", tarfile.LNKTYPE, b"")
    data = finish(body)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        ref = {m.name: tf.extractfile(m).read() for m in tf if m.isreg()}
    kind, got = check_scan(data)
    assert kind == "ok"
    got = {f"{k}.{s}": v for k, _, m in got for s, v in m.items()}
    assert got == {k: v for k, v in ref.items() if k.endswith(".json")}
    assert [k for k, _ in _walk_bytes(data)] == ["k0", "k1", "k2", "k3", "k4", "c"]
    assert dict(_walk_bytes(data))["c"] == {"txt": b"contiguous"} == {"txt": ref["c.txt"]}


def _walk_bytes(data: bytes):
    return [(s.key, s.members) for s in sample_groups(TarScanner(io.BytesIO(data), URL), lambda suffix: -1)]


# ---------------------------------------------------------------- hand-built sparse maps


def _num(n: int) -> bytes:
    return tarfile.itn(n, 12, tarfile.GNU_FORMAT)


def _resum(head: bytearray) -> bytes:
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\0 " % sum(head)
    return bytes(head)


def gnu_sparse(name: str, regions, real: int, stored: bytes, extended_forever: bool = False) -> bytes:
    """A GNU old-style sparse member ('S'): 4 map slots in the header, the rest in extension blocks."""
    ti = tarfile.TarInfo(name)
    ti.type, ti.size = tarfile.GNUTYPE_SPARSE, len(stored)
    head = bytearray(ti.tobuf(tarfile.GNU_FORMAT)[-512:])
    for i, (o, n) in enumerate(regions[:4]):
        head[386 + 24 * i : 410 + 24 * i] = _num(o) + _num(n)
    rest = list(regions[4:])
    head[482] = 1 if rest or extended_forever else 0
    head[483:495] = _num(real)
    out = [_resum(head)]
    while rest or extended_forever:
        block = bytearray(512)
        for i, (o, n) in enumerate(rest[:21]):
            block[24 * i : 24 * i + 24] = _num(o) + _num(n)
        rest = rest[21:]
        block[504] = 1 if rest or extended_forever else 0
        out.append(bytes(block))
        if extended_forever and len(out) > 3200:  # past the 65536-region bound (3121 blocks)
            break
    return b"".join(out) + stored + bytes(-len(stored) % 512)


def pax_sparse(version: str, name: str, regions, real: int, stored: bytes, extra: bytes = b"",
               map_text: bytes | None = None) -> bytes:
    """A pax sparse member as GNU tar writes it, in format 0.0, 0.1 or 1.0."""
    recs = extra
    data = stored
    header_name = name
    if version == "1.0":
        recs += record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0")
        recs += record("GNU.sparse.name", name) + record("GNU.sparse.realsize", str(real))
        text = map_text if map_text is not None else b"%d\n" % len(regions) + b"".join(
            b"%d\n%d\n" % r for r in regions)
        data = text + bytes(-len(text) % 512) + stored
        header_name = "GNUSparseFile.0/" + name
    else:
        recs += record("GNU.sparse.size", str(real)) + record("GNU.sparse.numblocks", str(len(regions)))
        if version == "0.1":
            recs += record("GNU.sparse.name", name)
            recs += record("GNU.sparse.map", ",".join(f"{o},{n}" for o, n in regions))
            header_name = "GNUSparseFile.0/" + name
        else:
            for o, n in regions:
                recs += record("GNU.sparse.offset", str(o)) + record("GNU.sparse.numbytes", str(n))
    return pax(recs) + member(header_name, data)


def encode(kind: str, name: str, regions, real: int, stored: bytes) -> bytes:
    return gnu_sparse(name, regions, real, stored) if kind == "gnu" else pax_sparse(kind, name, regions, real, stored)


KINDS = ["gnu", "0.0", "0.1", "1.0"]


def _scan_all(data: bytes, stream: bool = False):
    f = io.BufferedReader(Stream(data)) if stream else io.BytesIO(data)
    return [(s.key, s.sizes, s.members) for s in sample_groups(TarScanner(f, URL), lambda suffix: -1)]


def check_sparse(data: bytes, max_bytes: int = 8 << 20):
    """Seekable and streamed scans agree and end in samples or a ShardError
    naming the shard; samples they give hold the bytes tarfile extracts."""
    a = bounded(_scan_all, data, max_bytes=max_bytes)
    b = bounded(_scan_all, data, True, max_bytes=max_bytes)
    assert a[0] == b[0] and (a[0] != "ok" or a == b), (a, b)
    if a[0] != "ok":
        assert URL in a[1]
        return a
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        ref = {m.name: tf.extractfile(m).read() for m in tf if m.isreg()}
    assert {f"{k}.{s}": v for k, _, m in a[1] for s, v in m.items()} == ref
    return a


@pytest.mark.parametrize("kind", KINDS)
def test_hand_built_sparse_members_match_tarfile(kind):
    regions = [(0, 700), (5000, 10), (9000, 1024), (20000, 0)]
    stored = bytes(range(256)) * 6 + b"abcdefgh" * 35
    stored = stored[:1734]
    body = encode(kind, "k.wav", regions, 20000, stored) + member("k.json", b"{}")
    kind_, got = check_sparse(finish(body))
    assert kind_ == "ok" and got[0][0] == "k" and got[0][1] == {"wav": 20000, "json": 2}
    wav = got[0][2]["wav"]
    assert wav[:700] == stored[:700] and wav[700:5000] == bytes(4300) and wav[9000:10024] == stored[710:]
    # many regions: GNU extension blocks, a long 0.1 map, a multi-block 1.0 map
    regions = [(10 * i, 3) for i in range(500)] + [(5_000, 0)]  # a 1.0 map of 7 blocks
    data = finish(encode(kind, "m.bin", regions, 5_000, bytes(range(250)) * 6))
    assert check_sparse(data)[0] == "ok"


BAD_MAPS = {
    "overlap": ([(0, 100), (50, 100), (1000, 0)], 1000, 200),
    "past the real size": ([(0, 100), (950, 100)], 1000, 200),
    "ends before the real size": ([(0, 100), (500, 100)], 1000, 200),
    "holds less than stored": ([(0, 100), (1000, 0)], 1000, 200),
    "holds more than stored": ([(0, 300), (1000, 0)], 1000, 200),
    "unsorted": ([(500, 100), (0, 100), (1000, 0)], 1000, 200),
    "huge real size": ([(0, 100), (10**15, 0)], 10**15, 100),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(BAD_MAPS))
def test_bad_sparse_maps_are_shard_errors(kind, case):
    regions, real, stored = BAD_MAPS[case]
    data = finish(encode(kind, "k.wav", regions, real, bytes(stored)) + member("k.json", b"{}"))
    kind_, msg = check_sparse(data, max_bytes=4 << 20)
    assert kind_ == "shard-error" and "sparse member 'k.wav'" in msg and "byte 0" in msg, msg
    assert "--no-read-sparse" in msg  # the fix


@pytest.mark.parametrize("variant", [
    "1.0 count 10**9", "1.0 not a number", "1.0 map past the data", "1.0 no realsize", "2.0 format",
    "0.1 odd map", "0.1 not a number", "0.1 too many regions", "0.0 unpaired", "0.0 no size",
    "numblocks mismatch", "gnu endless extension blocks", "gnu bad octal", "gnu and pax at once",
])
def test_malformed_sparse_headers_are_shard_errors(variant):
    ok = [(0, 100), (1000, 0)]
    stored = bytes(100)
    if variant == "1.0 count 10**9":
        body = pax_sparse("1.0", "k.wav", ok, 1000, stored, map_text=b"1000000000\n0\n100\n")
    elif variant == "1.0 not a number":
        body = pax_sparse("1.0", "k.wav", ok, 1000, stored, map_text=b"2\n0\n1x0\n1000\n0\n")
    elif variant == "1.0 map past the data":
        # a map of 200 regions, 512 bytes of it, then 100 bytes of data: the map runs past the data
        body = pax_sparse("1.0", "k.wav", ok, 1000, b"1\n" * 50, map_text=b"200\n" + b"1\n" * 254)
    elif variant == "1.0 no realsize":
        body = pax(record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0")) + member(
            "k.wav", b"2\n0\n100\n1000\n0\n".ljust(512, b"\0") + stored)
    elif variant == "2.0 format":
        body = pax(record("GNU.sparse.major", "2") + record("GNU.sparse.minor", "0")
                   + record("GNU.sparse.realsize", "1000")) + member("k.wav", stored)
    elif variant == "0.1 odd map":
        body = pax(record("GNU.sparse.size", "1000") + record("GNU.sparse.map", "0,100,1000")) + member("k.wav", stored)
    elif variant == "0.1 not a number":
        body = pax(record("GNU.sparse.size", "1000") + record("GNU.sparse.map", "0,1e2,1000,0")) + member(
            "k.wav", stored)
    elif variant == "0.1 too many regions":
        body = pax(record("GNU.sparse.size", "100000000") + record("GNU.sparse.map", "1,0," * 70000 + "1,0")
                   ) + member("k.wav", b"")
    elif variant == "0.0 unpaired":
        body = pax(record("GNU.sparse.size", "1000") + record("GNU.sparse.offset", "0")
                   + record("GNU.sparse.offset", "1000") + record("GNU.sparse.numbytes", "0")) + member("k.wav", b"")
    elif variant == "0.0 no size":
        body = pax(record("GNU.sparse.offset", "0") + record("GNU.sparse.numbytes", "100")) + member("k.wav", stored)
    elif variant == "numblocks mismatch":
        body = pax(record("GNU.sparse.size", "1000") + record("GNU.sparse.map", "0,100,1000,0")
                   + record("GNU.sparse.numblocks", "7")) + member("k.wav", stored)
    elif variant == "gnu endless extension blocks":
        body = gnu_sparse("k.wav", ok, 1000, stored, extended_forever=True)
    elif variant == "gnu bad octal":  # in an extension block (tarfile checks the header's own slots)
        body = bytearray(gnu_sparse("k.wav", [(0, 20), (30, 20), (60, 20), (90, 20), (120, 20), (1000, 0)],
                                    1000, stored))
        body[512 + 24 : 512 + 36] = b"12345678zz\0\0"
    else:
        body = pax(record("GNU.sparse.size", "1000") + record("GNU.sparse.map", "0,100,1000,0")) + gnu_sparse(
            "k.wav", ok, 1000, stored)
    kind, msg = check_sparse(finish(bytes(body) + member("k.json", b"{}")), max_bytes=6 << 20)
    assert kind == "shard-error" and "sparse member 'k.wav'" in msg and "byte 0" in msg, (variant, msg)


_region_lists = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 700)), max_size=8)


@st.composite
def sparse_cases(draw):
    """A well-formed map (gaps and lengths), then perhaps one damaged number."""
    pos, regions = 0, []
    for gap, n in draw(_region_lists):
        regions.append((pos + gap, n))
        pos += gap + n
    real = pos + draw(st.integers(0, 2000))
    if draw(st.booleans()) or not regions or regions[-1][0] + regions[-1][1] != real:
        regions.append((real, 0))  # writers close the map at the real size
    stored = sum(n for _, n in regions)
    damage = draw(st.sampled_from(["none", "offset", "numbytes", "real", "stored"]))
    if damage in ("offset", "numbytes"):
        i = draw(st.integers(0, len(regions) - 1))
        o, n = regions[i]
        delta = draw(st.integers(-600, 600) | st.sampled_from([10**12, 2**40]))
        regions[i] = (max(0, o + delta), n) if damage == "offset" else (o, max(0, n + delta))
    elif damage == "real":
        real = max(0, real + draw(st.integers(-600, 600) | st.just(10**13)))
    elif damage == "stored":
        stored = max(0, stored + draw(st.integers(-600, 600)))
    return draw(st.sampled_from(KINDS)), regions, real, stored, damage


@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck))
@given(case=sparse_cases())
def test_fuzz_sparse_maps(case):
    kind, regions, real, stored, damage = case
    data = finish(encode(kind, "k.bin", regions, real, bytes(range(256)) * (stored // 256) + bytes(stored % 256))
                  + member("k.json", b"{}"))
    got = check_sparse(data, max_bytes=6 << 20)
    if damage == "none":
        assert got[0] == "ok", got


@needs_gnu
@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=6),
       cut=st.none() | st.integers(0, 1 << 20), which=st.sampled_from(["gnu", "pax-1.0"]))
def test_fuzz_real_sparse_shards(small_sparse_shards, flips, cut, which):
    base = small_sparse_shards[which]
    data = bytearray(base)
    for pos, val in flips:  # half the flips land in the first 3 blocks: headers and the 1.0 map
        data[(pos % 1536) if pos & 1 else pos % len(data)] = val
    if cut is not None:
        del data[cut % (len(data) + 1):]
    check_scan(bytes(data))


@pytest.fixture(scope="module")
def small_sparse_shards(tmp_path_factory):
    """GNU tar's old-style and pax 1.0 sparse encodings of a 64 KiB file with
    3 data runs (small, so scans of damaged copies stay fast)."""
    if GNU_TAR is None:
        pytest.skip("GNU tar is not installed")
    d = tmp_path_factory.mktemp("small-sparse")
    data = bytearray(65536)
    for at in (0, 20480, 61440):
        data[at : at + 4096] = b"q" * 4096
    write_holey(d / "k.bin", bytes(data))
    (d / "k.json").write_bytes(b'{"duration": 1}')
    out = {}
    for which, args in (("gnu", ["--format=gnu"]), ("pax-1.0", ["--format=posix", "--sparse-version=1.0"])):
        path = d / f"{which}.tar"
        subprocess.run(["tar", "--sparse", *args, "-cf", str(path), "-C", str(d), "k.bin", "k.json"], check=True)
        if not sparse_names(str(path)):
            pytest.skip("this filesystem does not keep holes")
        out[which] = path.read_bytes()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["gnu-oldgnu", "bsdtar"])
def test_sparse_shards_over_http(holey_dir, writer, tmp_path):
    # Remote indexing reads member heads through ranged GETs (a 512-byte WAV head, rebuilt from the
    # map); streaming downloads the shard; both give tarfile's bytes and the real frame counts.
    from tests.support.servers import nginx_server

    path = make_sparse_tar(holey_dir, writer)
    root = tmp_path / "www"
    root.mkdir()
    shutil.copy(path, root / "sparse-000.tar")
    ref = tarfile_members(path)
    with nginx_server(root) as ng:
        urls = [f"{ng.url}/sparse-000.tar"]
        idx = str(tmp_path / "idx")
        summary = index_shards(urls, length_from="audio", index_dir=idx, workers=1, progress=False)
        assert summary.total_length == FRAMES + FRAMES + 8000
        ds = StreamingBatches(urls, 10**6, 4, world_size=1, rank=0, index_dir=idx, cache_dir=str(tmp_path / "c"))
        got = {s["__key__"]: s for b in ds for s in b}
    assert sorted(got) == ["utt0", "utt1", "utt2"]
    for key, s in got.items():
        assert s["wav"] == ref[f"{key}.wav"] and s["json"] == ref[f"{key}.json"]
