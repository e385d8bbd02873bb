"""Sparse tar members: their maps, checked, and the file rebuilt from them.

A file with holes (bsdtar stores one as sparse by default, GNU tar with
``--sparse``) is archived as its data regions only, plus a map of
``(offset, numbytes)`` pairs saying where each region sits in the real file;
the holes read as zeros. The map is stored in one of four ways:

- GNU old style: member type ``'S'``, four map slots in the header, more in
  512-byte extension blocks after it (21 slots each), the real size at byte
  483 of the header;
- pax 0.0: repeated ``GNU.sparse.offset`` / ``GNU.sparse.numbytes`` records,
  the real size in ``GNU.sparse.size``;
- pax 0.1: one ``GNU.sparse.map`` record ``"o,n,o,n,..."``;
- pax 1.0 (``GNU.sparse.major=1``, ``minor=0``): the map at the start of the
  member's data as decimal lines (count, then the pairs), padded to a block;
  the real name in ``GNU.sparse.name`` (the header's is
  ``GNUSparseFile.0/...``) and the real size in ``GNU.sparse.realsize``.

The file rebuilt is the one Python's ``tarfile`` extracts. Maps are checked
first: regions in order, not overlapping, inside the real size, the last one
ending at it (real writers always close the map there, with a zero-length
region if the file ends in a hole) and their lengths adding up to the stored
data exactly; at most ``MAX_ENTRIES`` regions and ``MAX_SIZE`` bytes. A map
that fails is a ``ShardError``: damage, never a guess at the bytes.

Stream: the data extents of GNU/PAX sparse members (the holes read as zeros)."""

from __future__ import annotations

import re
import tarfile

from ..errors import ShardError

MAX_ENTRIES = 1 << 16  # regions per member; GNU tar writes one per data run
MAX_SIZE = 1 << 32  # bytes a sparse member may expand to (all of them are held in memory)
BLOCK = 512
_GNU_SLOTS = 4  # map slots in an 'S' header, at byte 386, 24 bytes each
_EXT_SLOTS = 21  # map slots in an extension block
_DECIMAL = re.compile(r"[0-9]+")
_MAP_LINE = re.compile(rb"([0-9]+)\n")
FIX = ("re-create the shard without sparse members (bsdtar --no-read-sparse, or GNU tar without --sparse), "
       "or replace it if it is damaged")

Regions = tuple[tuple[int, int], ...]


def sparse_error(url: str, at: int, name: str, why: str) -> ShardError:
    return ShardError(f"sparse member {name!r} in shard {url} at byte {at} cannot be read: {why}; {FIX}")


def _slots(block: bytes, start: int, count: int) -> tuple[list[tuple[int, int]], bool]:
    """The filled (offset, numbytes) slots of a GNU map area, and whether the
    area ended early (a slot whose numbytes field starts with NUL ends the map,
    as GNU tar reads it). Raises ValueError for a malformed number."""
    out = []
    for i in range(count):
        pos = start + 24 * i
        if block[pos + 12] == 0:
            return out, True
        out.append((tarfile.nti(block[pos : pos + 12]), tarfile.nti(block[pos + 12 : pos + 24])))
    return out, False


def gnu_header_map(block: bytes) -> tuple[list[tuple[int, int]], bool, int]:
    """(regions, isextended, real size) from an 'S' header block."""
    regions, _ = _slots(block, 386, _GNU_SLOTS)
    return regions, bool(block[482]), tarfile.nti(block[483:495])


def gnu_extension_map(block: bytes) -> tuple[list[tuple[int, int]], bool]:
    """(regions, isextended) from a GNU sparse extension block."""
    regions, _ = _slots(block, 0, _EXT_SLOTS)
    return regions, bool(block[504])


def max_extension_blocks() -> int:
    return -(-MAX_ENTRIES // _EXT_SLOTS)


def decimal(value: str, what: str) -> int:
    """A pax decimal value, strictly (ValueError naming ``what`` otherwise)."""
    if not _DECIMAL.fullmatch(value):
        raise ValueError(f"{what} is {value[:40]!r}, not a decimal number")
    return int(value)


def pax_01_map(value: str) -> list[tuple[int, int]]:
    """Regions of a ``GNU.sparse.map`` record (pax 0.1)."""
    parts = value.split(",") if value else []
    if len(parts) % 2:
        raise ValueError(f"GNU.sparse.map holds {len(parts)} numbers, not pairs")
    if len(parts) > 2 * MAX_ENTRIES:
        raise ValueError(f"GNU.sparse.map holds {len(parts) // 2} regions, more than the {MAX_ENTRIES} allowed")
    nums = [decimal(p, "a GNU.sparse.map number") for p in parts]
    return list(zip(nums[::2], nums[1::2]))


def pax_00_map(records: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """Regions of repeated ``GNU.sparse.offset`` / ``numbytes`` records (pax 0.0), in pairs."""
    if len(records) > 2 * MAX_ENTRIES:
        raise ValueError(f"{len(records) // 2} GNU.sparse.offset records, more than the {MAX_ENTRIES} allowed")
    out = []
    for i in range(0, len(records), 2):
        pair = records[i : i + 2]
        if [k for k, _ in pair] != ["GNU.sparse.offset", "GNU.sparse.numbytes"]:
            raise ValueError("GNU.sparse.offset and GNU.sparse.numbytes records do not come in pairs")
        out.append((decimal(pair[0][1], "GNU.sparse.offset"), decimal(pair[1][1], "GNU.sparse.numbytes")))
    return out


def check_regions(regions: list[tuple[int, int]], real: int, stored: int) -> Regions:
    """The data regions (numbytes > 0) of a map checked against the real and
    stored sizes; ValueError saying what is wrong otherwise."""
    if real > MAX_SIZE:
        raise ValueError(f"it expands to {real} bytes, more than the {MAX_SIZE}-byte limit for sparse members")
    if len(regions) > MAX_ENTRIES:
        raise ValueError(f"its map has {len(regions)} regions, more than the {MAX_ENTRIES} allowed")
    end = total = 0
    out = []
    for offset, numbytes in regions:
        if offset < 0 or numbytes < 0:
            raise ValueError(f"its map has a negative region ({offset}, {numbytes})")
        if offset < end:
            raise ValueError(f"its map region at {offset} overlaps the one before (which ends at {end})")
        end = offset + numbytes
        if end > real:
            raise ValueError(f"its map region ({offset}, {numbytes}) runs past the real size {real}")
        total += numbytes
        if numbytes:
            out.append((offset, numbytes))
    if end != real:
        raise ValueError(f"its map ends at byte {end} of the file but the real size is {real}")
    if total != stored:
        raise ValueError(f"its map holds {total} bytes of data but the member stores {stored}")
    return tuple(out)


def rebuild(regions: Regions, real: int, start: int, n: int, read) -> bytes:
    """Bytes [start, start + n) of the real file: zeros in the holes,
    ``read(stored_offset, k)`` for the data (stored offsets count from the
    first data byte)."""
    parts, pos, stored, end = [], start, 0, min(start + n, real)
    for offset, numbytes in regions:
        if pos >= end:
            break
        if offset + numbytes <= pos:
            stored += numbytes
            continue
        if pos < offset:
            k = min(offset, end) - pos
            parts.append(bytes(k))
            pos += k
            if pos >= end:
                break
        k = min(offset + numbytes, end) - pos
        parts.append(read(stored + pos - offset, k))
        pos += k
        stored += numbytes
    if pos < end:
        parts.append(bytes(end - pos))
    return b"".join(parts)


# ``scanner`` below is a ``tar.TarScanner``: its _read / _check_fits / _truncated keep its
# position, the file-size bound and the error messages the same as for any other member.
def read_map(scanner, ti: tarfile.TarInfo, block: bytes, overrides: dict[str, str],
             sparse_00: list[tuple[str, str]], first: int, name: str, stored: int):
    """(regions, real size, stored bytes after the map) of the member whose
    header ``block`` ``scanner`` (a ``tar.TarScanner``) just read, reading its
    extension blocks or in-data map; None if it is not sparse. ``overrides``:
    its pax records (``sparse_00``: the repeated 0.0 ones, in order); ``first``:
    its first header's byte; ``stored``: its data size in the archive."""
    pax = ("GNU.sparse.major" in overrides or "GNU.sparse.minor" in overrides or "GNU.sparse.map" in overrides
           or "GNU.sparse.size" in overrides or bool(sparse_00))
    gnu = ti.type == tarfile.GNUTYPE_SPARSE
    if not pax and not gnu:
        return None

    def fail(why: str) -> ShardError:
        return sparse_error(scanner.url, first, name, why)

    if pax and gnu:
        raise fail("it carries both a GNU 'S' map and pax GNU.sparse records")
    try:
        if gnu:
            regions, extended, real = gnu_header_map(block)
            blocks = 0
            while extended:
                blocks += 1
                if blocks > max_extension_blocks():
                    raise ValueError(f"its map runs past {MAX_ENTRIES} regions")
                scanner._check_fits(first, scanner.pos, BLOCK + stored)
                ext = scanner._read(BLOCK)
                if len(ext) != BLOCK:
                    raise scanner._truncated(scanner.pos, "inside a sparse member's map")
                more, extended = gnu_extension_map(ext)
                regions += more
        elif "GNU.sparse.major" in overrides or "GNU.sparse.minor" in overrides:
            version = (overrides.get("GNU.sparse.major"), overrides.get("GNU.sparse.minor"))
            if version != ("1", "0"):
                raise ValueError(f"it uses GNU sparse format {version[0]}.{version[1]}, which streambatch "
                                 "does not read (only 0.0, 0.1 and 1.0)")
            if "GNU.sparse.realsize" not in overrides:
                raise ValueError("its pax header has no GNU.sparse.realsize")
            real = decimal(overrides["GNU.sparse.realsize"], "GNU.sparse.realsize")
            regions, used = _read_10_map(scanner, first, stored)
            stored -= used
        else:
            if "GNU.sparse.size" not in overrides:
                raise ValueError("its pax header has no GNU.sparse.size")
            real = decimal(overrides["GNU.sparse.size"], "GNU.sparse.size")
            if "GNU.sparse.map" in overrides:
                regions = pax_01_map(overrides["GNU.sparse.map"])
            else:
                regions = pax_00_map(sparse_00)
            if "GNU.sparse.numblocks" in overrides and \
                    decimal(overrides["GNU.sparse.numblocks"], "GNU.sparse.numblocks") != len(regions):
                raise ValueError(f"GNU.sparse.numblocks is {overrides['GNU.sparse.numblocks']} but its map "
                                 f"has {len(regions)} regions")
        return check_regions(regions, real, stored), real, stored
    except (ValueError, tarfile.HeaderError) as exc:
        if isinstance(exc, ShardError):
            raise
        raise fail(str(exc) if isinstance(exc, ValueError) else "a malformed number in its map") from None



def _read_10_map(scanner, first: int, stored: int) -> tuple[list[tuple[int, int]], int]:
    """The pax 1.0 map at the start of the member's data, decimal lines
    (count, then the pairs) padded to a block: (regions, bytes it took).
    Parsed block by block, so a long map costs its length once."""
    scanner._check_fits(first, scanner.pos, stored)
    count, nums, tail, used = None, [], b"", 0
    while True:
        if used + BLOCK > stored:
            raise ValueError(f"its map runs past the {stored} bytes of data the member stores")
        chunk = scanner._read(BLOCK)
        if len(chunk) != BLOCK:
            raise scanner._truncated(scanner.pos, "inside a sparse member's map")
        used += BLOCK
        text, pos = tail + chunk, 0
        while count is None or len(nums) < 2 * count:
            m = _MAP_LINE.match(text, pos)
            if m is None:
                tail = text[pos:]
                if len(tail) >= 24 or (tail and not tail.isdigit()):  # else a number cut at the block's end
                    what = "a count" if count is None else "a number"
                    raise ValueError(f"its map holds {tail[:24]!r} where {what} was expected")
                break
            pos = m.end()
            if count is None:
                count = int(m.group(1))
                if count > MAX_ENTRIES:
                    raise ValueError(f"its map declares {count} regions, more than the {MAX_ENTRIES} allowed")
            else:
                nums.append(int(m.group(1)))
        else:
            return list(zip(nums[::2], nums[1::2])), used
