"""The tar scanner against hostile input: pax records, member sizes, the
end-of-archive marker, and fuzzing (byte flips, truncations, hand-built pax
headers). Every case must end, quickly and with bounded memory, in samples or
a ``ShardError``."""

from __future__ import annotations

import io
import shutil
import signal
import subprocess
import tarfile
import tracemalloc

import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streambatch.streaming import ShardError, index_shards
from streambatch.streaming.formats.tar import TarScanner
from streambatch.streaming.formats.tar_samples import parse_sample, sample_groups
from tests.support.helpers import examples

URL = "mem/shard-000.tar"
RECORD = 10240  # tar writers pad archives to a multiple of this


# ---------------------------------------------------------------- building tars by hand


def member(name: str, data: bytes) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


def pax(records: bytes, declared: int | None = None) -> bytes:
    """A pax extended header ('x') holding ``records`` verbatim."""
    ti = tarfile.TarInfo("././@PaxHeader")
    ti.type = tarfile.XHDTYPE
    ti.size = len(records) if declared is None else declared
    # GNU format: base-256 size fields, so any declared size fits
    return ti.tobuf(tarfile.GNU_FORMAT) + records + bytes(-len(records) % 512)


def record(key: str, value: str) -> bytes:
    """One well-formed pax record ``"%d %s=%s\\n"`` (the length counts itself)."""
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def finish(body: bytes) -> bytes:
    """Two zero blocks, then zeros to the next record boundary (what tarfile writes)."""
    out = body + bytes(1024)
    return out + bytes(-len(out) % RECORD)


def small_shard(n: int = 3) -> bytes:
    """A real pax-format shard written by tarfile: long member names (pax
    ``path`` records), one sample with a pax ``size`` record too."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(n):
            key = f"{'d' * 90}/utt{i:03d}"  # > 100 bytes with the suffix: a pax path record
            for suffix, data in (("json", b'{"duration": %d.5}' % i), ("txt", b"x" * (700 + 37 * i))):
                ti = tarfile.TarInfo(f"{key}.{suffix}")
                ti.size = len(data)
                if i == 1 and suffix == "txt":
                    ti.pax_headers = {"size": str(len(data)), "comment": "c" * 40}
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


class Stream(io.RawIOBase):
    """A non-seekable stream over bytes (a pipe), delivering short reads."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), len(self.data) - self.pos, 700)
        b[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def _want(suffix: str):
    return -1 if suffix == "json" else None  # read the json, skip (seek past) the rest


def scan(data: bytes, stream: bool = False) -> list[tuple[str, dict[str, int], dict[str, bytes]]]:
    f = io.BufferedReader(Stream(data)) if stream else io.BytesIO(data)
    return [(s.key, s.sizes, s.members) for s in sample_groups(TarScanner(f, URL), _want)]


class TookTooLong(Exception):
    pass


def _alarm(signum, frame):
    raise TookTooLong


def bounded(fn, *args, seconds: float = 2.0, max_bytes: int = 8 << 20):
    """Run ``fn`` with a wall-clock limit and a limit on Python allocations;
    returns ("ok", result) or ("shard-error", message)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        out = ("ok", fn(*args))
    except ShardError as exc:
        out = ("shard-error", str(exc))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        signal.signal(signal.SIGALRM, old)
    assert peak < max_bytes, f"scanning {len(args[0])} bytes allocated {peak} bytes"
    return out


def check_scan(data: bytes):
    """The invariant: seekable and streamed scans both end, in the same
    samples or both in a ShardError naming the shard."""
    a = bounded(scan, data)
    b = bounded(scan, data, True)
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        assert a == b
    else:
        assert URL in a[1] and URL in b[1]
    return a


# ---------------------------------------------------------------- item 2: pax records and sizes


@pytest.mark.parametrize("records", [
    b"0 path=a\n",                     # length 0: used to loop forever
    b"-4 path=a\n",                    # negative
    b"3 path=a\n",                     # shorter than its own key
    b"90 path=a\n",                    # past the data
    b"7 path\n",                       # no '='
    b"x path=a\n", b" 9 path=a\n", b"9\tpath=a\n", b"1_0 path=ab\n",  # not a plain decimal
    b"10 path=a\n\n",                  # does not end in a newline where its length says
    b"9path=ab\n",                     # no space after the length
])
def test_malformed_pax_record_is_a_shard_error(records):
    data = finish(pax(records) + member("k.json", b"{}"))
    for stream in (False, True):
        kind, msg = bounded(scan, data, stream)
        assert kind == "shard-error" and "pax" in msg and "byte 0" in msg, msg


@pytest.mark.parametrize("value", ["1000000000000000", "-5", "abc", "", "+5", " 5", "5 ", "1e3", "0x10"])
def test_bad_pax_size_is_a_shard_error_without_allocating(value):
    data = finish(pax(record("size", value)) + member("k.json", b"{}") + member("k.txt", b"x"))
    for stream in (False, True):
        kind, msg = bounded(scan, data, stream, max_bytes=4 << 20)
        assert kind == "shard-error" and URL in msg, msg


def test_huge_extended_header_and_negative_base256_size():
    # a pax header declaring 10**15 bytes of records
    data = finish(pax(record("path", "k.json"), declared=10**15) + member("k.json", b"{}"))
    for stream in (False, True):
        assert bounded(scan, data, stream, max_bytes=4 << 20)[0] == "shard-error"
    # a member whose size field is a negative base-256 number
    head = bytearray(member("k.json", b"")[:512])
    head[124:136] = b"\xff" * 12
    data = finish(_resum(head) + member("k.txt", b"x"))
    for stream in (False, True):
        kind, msg = bounded(scan, data, stream)
        assert kind == "shard-error", msg


def test_good_pax_records_apply():
    data = finish(pax(record("path", "long/name.json") + record("size", "2") + record("comment", "a=b"))
                  + member("short.json", b"{}"))
    assert check_scan(data) == ("ok", [("long/name", {"json": 2}, {"json": b"{}"})])
    got = check_scan(small_shard())
    assert got[0] == "ok" and [k[-6:] for k, _, _ in got[1]] == ["utt000", "utt001", "utt002"]
    assert [s["txt"] for _, s, _ in got[1]] == [700, 737, 774]


def test_non_utf8_member_names_stream_like_webdataset(tmp_path):
    path = tmp_path / "latin.tar"
    path.write_bytes(finish(_raw_member(b"caf\xe9.json", b'{"duration": 1.0}')))
    index_shards([str(path)], frames_per_second=10, workers=1, progress=False)
    from streambatch.streaming import StreamingBatches

    got = [s for b in StreamingBatches([str(path)], 100, 4, world_size=1, rank=0) for s in b]
    ref = list(wds.WebDataset(str(path), shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in ref] == ["caf\udce9"]


def _raw_member(name: bytes, data: bytes) -> bytes:
    head = bytearray(member("x" * len(name), data)[:512])
    head[: len(name)] = name
    return _resum(head) + data + bytes(-len(data) % 512)


def _resum(head: bytearray) -> bytes:
    """A header block with its checksum recomputed (so only our edit is wrong)."""
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\0 " % sum(head)
    return bytes(head)


# ---------------------------------------------------------------- item 3: the end of the archive


def test_shard_cut_at_a_member_boundary_is_truncated():
    shard = small_shard(4)
    cuts = [i for i in range(512, len(shard), 512) if shard[i : i + 1] not in (b"\0", b"")]
    for cut in cuts:  # every header start: an interrupted copy in 512-byte blocks
        kind, msg = check_scan(shard[:cut])
        assert kind == "shard-error" and "truncated" in msg, (cut, msg)
    assert check_scan(b"")[0] == "shard-error"  # an empty file is not a tar


def test_zero_block_mid_shard_is_not_an_end():
    a, b, c = member("a.json", b"{}"), member("b.json", b"{}"), member("c.json", b"{}")
    for data in (finish(a + bytes(512) + b + c),                   # a zero block between members
                 finish(a + bytes(1024) + b + c),                  # a whole end marker, then more members
                 a + bytes(512) + b"\1" + bytes(511),              # a lone zero block, then garbage
                 a + bytes(512),                                   # only one zero block
                 a + bytes(1024) + bytes(100) + b"x"):             # non-zero bytes after the marker
        kind, msg = check_scan(data)
        assert kind == "shard-error", msg
    # one end marker, then only zeros (any amount): the end
    for tail in (1024, 1024 + 300, RECORD - len(a), 3 * RECORD):
        assert check_scan(a + bytes(tail)) == ("ok", [("a", {"json": 2}, {"json": b"{}"})])


def test_real_writers_end_their_archives_properly(tmp_path):
    samples = [{"__key__": f"s{i}", "json": b'{"duration": 0.5}', "txt": b"t" * i} for i in range(5)]
    with wds.TarWriter(str(tmp_path / "wds.tar")) as sink:
        for s in samples:
            sink.write(s)
    formats = ((tarfile.GNU_FORMAT, "gnu.tar"), (tarfile.PAX_FORMAT, "pax.tar"), (tarfile.USTAR_FORMAT, "ustar.tar"))
    for fmt, name in formats:
        with tarfile.open(tmp_path / name, "w", format=fmt) as tf:
            for s in samples:
                for k in ("json", "txt"):
                    ti = tarfile.TarInfo(f"{s['__key__']}.{k}")
                    ti.size = len(s[k])
                    tf.addfile(ti, io.BytesIO(s[k]))
    files = ["wds.tar", "gnu.tar", "pax.tar", "ustar.tar"]
    if shutil.which("tar"):  # GNU tar itself (blocking factor 20: 10240-byte records)
        src = tmp_path / "src"
        src.mkdir()
        for s in samples:
            for k in ("json", "txt"):
                (src / f"{s['__key__']}.{k}").write_bytes(s[k])
        names = sorted(p.name for p in src.iterdir())
        subprocess.run(["tar", "-cf", str(tmp_path / "gnutar.tar"), "-C", str(src), *names], check=True)
        files.append("gnutar.tar")
    for name in files:
        data = (tmp_path / name).read_bytes()
        assert len(data) % RECORD == 0
        kind, got = check_scan(data)
        assert kind == "ok" and [k for k, _, _ in got] == [f"s{i}" for i in range(5)], (name, got)
    summary = index_shards([str(tmp_path / f) for f in files], frames_per_second=10, workers=1, progress=False)
    assert summary.samples == 5 * len(files)


def test_indexer_reports_a_cut_shard(tmp_path):
    shard = small_shard(4)
    cut = next(i for i in range(len(shard) // 2, len(shard), 512) if shard[i : i + 1] not in (b"\0", b""))
    (tmp_path / "cut.tar").write_bytes(shard[:cut])
    with pytest.raises(ShardError, match=r"cut\.tar is truncated"):
        index_shards([str(tmp_path / "cut.tar")], frames_per_second=10, workers=1, progress=False)


def test_parse_sample_needs_no_end_marker():
    # a sample's bytes alone (as read by offset) have no end-of-archive marker
    sample = parse_sample(member("k.json", b"{}") + member("k.txt", b"abc"), URL, 0, "k")
    assert sample == {"__key__": "k", "__url__": URL, "json": b"{}", "txt": b"abc"}


# ---------------------------------------------------------------- fuzzing


def _mutate(base: bytes, flips, cut):
    data = bytearray(base)
    for pos, val in flips:
        data[pos % len(data)] = val
    if cut is not None:
        del data[cut % (len(data) + 1):]
    return bytes(data)


_flips = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=6)
_cut = st.none() | st.integers(0, 1 << 20)
_SHARD = small_shard(3)


def _header_biased(flips):
    # most flips land in header blocks and pax records, where the parsing is
    blocks = [i for i in range(0, len(_SHARD), 512) if _SHARD[i + 257 : i + 262] == b"ustar"]
    return [((blocks[p % len(blocks)] + (p >> 4) % 1024) if p & 1 else p, v) for p, v in flips]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(flips=_flips, cut=_cut)
def test_fuzz_real_shard(flips, cut):
    check_scan(_mutate(_SHARD, _header_biased(flips), cut))


_numbers = st.sampled_from(["0", "-1", "1", "3", "7", "10**15", "99999", "", "x", " 8", "08"]) | \
    st.integers(-5, 200).map(str)


@st.composite
def pax_records(draw):
    """Records with arbitrary length fields, keys and values."""
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(["path", "size", "comment", "linkpath", "", "a=b"]))
        value = draw(st.sampled_from(["k.json", "2", "-5", "1" + "0" * 15, "abc", "", "k/\u00e9.json"])
                     | st.text(max_size=12))
        good = record(key, value)
        if draw(st.booleans()):
            n = draw(_numbers)
            good = (str(eval(n)) if n == "10**15" else n).encode() + good[good.index(b" "):]
        out += good
    if draw(st.booleans()):
        out += draw(st.binary(max_size=16))
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(records=pax_records(), declared=st.none() | st.integers(0, 2000) | st.just(10**15))
def test_fuzz_hand_built_pax_headers(records, declared):
    check_scan(finish(pax(records, declared) + member("k.json", b"{}") + member("k.txt", b"abc")))


@pytest.mark.slow
@settings(max_examples=examples(2500), deadline=None, suppress_health_check=list(HealthCheck))
@given(flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=24), cut=_cut,
       biased=st.booleans())
def test_fuzz_real_shard_long(flips, cut, biased):
    check_scan(_mutate(_SHARD, _header_biased(flips) if biased else flips, cut))


@pytest.mark.slow
@settings(max_examples=examples(2500), deadline=None, suppress_health_check=list(HealthCheck))
@given(records=pax_records(), declared=st.none() | st.integers(0, 4000) | st.just(10**15),
       flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=4))
def test_fuzz_hand_built_pax_headers_long(records, declared, flips):
    check_scan(_mutate(finish(pax(records, declared) + member("k.json", b"{}")), flips, None))
