"""Per-sample lengths from files: ``.npy``, plain text, JSON lines, JSON.

Formats are recognised by content, not by name, and any of them may be
gzip-compressed (``cuts.jsonl.gz``):

- ``.npy``: a 1-D numeric array (``np.save(path, lengths)``);
- text: one number per line (blank lines and ``#`` comments are skipped);
- JSON lines: one object per line with a duration field, as lhotse cut
  manifests (``duration`` at top level) and VoxCPM-style manifests
  (``duration`` or ``audio_duration``) have; ``field`` picks another one,
  with dots for nesting (``supervisions.0.duration``);
- JSON: an array of numbers or of such objects.

Lengths are planning units (frames, tokens). Values in seconds need
``frames_per_second``: a length is then ``ceil(seconds * fps)``, the rule
``streambatch index`` uses, so the same corpus plans alike from a manifest
and from its shards. Without it every value must be a whole number.
"""

from __future__ import annotations

import gzip
import io
import json
import numbers
import os
from array import array
from typing import IO, Any

import numpy as np

from ..core.units import check_fps, seconds_to_frames

DURATION_FIELDS = ("duration", "audio_duration")
_NPY_MAGIC = b"\x93NUMPY"
_GZIP_MAGIC = b"\x1f\x8b"
_BLOCK = 1 << 20  # text lines parsed per numpy call


def read_lengths(path: str, field: str | None = None, frames_per_second: float | None = None) -> np.ndarray:
    """(N,) int64 lengths read from ``path`` (see the module docstring).

    field: JSON field holding each sample's length or duration (default: the
        first of ``duration``, ``audio_duration`` that the first record has).
    frames_per_second: convert seconds to frames, ``ceil(v * fps)``.
    Raises FileNotFoundError/OSError for unreadable files and ValueError,
    naming the file and line, for malformed content.
    """
    path = os.fspath(path)
    fps = check_fps(frames_per_second, "frames per second")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory without .tar shards (its subdirectories included); pass a "
                                "lengths file (.npy, text, .jsonl), shard paths or a directory of shards")
    with open(path, "rb") as raw:
        head = raw.read(2)
    if head == _GZIP_MAGIC:
        with gzip.open(path, "rb") as f:
            try:
                return _read(f, path, field, fps)
            except (EOFError, gzip.BadGzipFile) as exc:
                raise ValueError(f"{path}: corrupt gzip data ({exc})") from None
    with open(path, "rb") as f:
        return _read(f, path, field, fps)


def _read(f: IO[bytes], path: str, field: str | None, fps: float | None) -> np.ndarray:
    buffered = io.BufferedReader(f) if not isinstance(f, io.BufferedReader) else f
    head = buffered.peek(64)[:64]
    if head.startswith(_NPY_MAGIC):
        if field is not None:
            raise ValueError(f"{path} is a .npy array; --field only applies to JSON manifests")
        # np.load reads a real file through its descriptor: gzip'd bytes must be inflated first.
        plain = isinstance(f, io.BufferedReader) and isinstance(f.raw, io.FileIO)
        return _from_npy(buffered if plain else io.BytesIO(buffered.read()), path, fps)
    text = io.TextIOWrapper(buffered, encoding="utf-8", errors="strict")
    try:
        first, lineno = _first_content_line(text)
        if first is None:
            raise ValueError(f"{path} holds no lengths (it is empty)")
        if first.startswith("{"):
            return _from_jsonl(text, first, lineno, path, field, fps)
        if first.startswith("["):
            return _from_json(first + text.read(), path, field, fps)
        if field is not None:
            raise ValueError(f"{path} is a plain list of numbers (line {lineno}: {first[:40]!r}); "
                             "--field only applies to JSON manifests")
        return _from_text(text, first, lineno, path, fps)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is neither a .npy array nor UTF-8 text ({exc.reason} at byte {exc.start}); "
                         "pass a .npy, a text file of one length per line or a JSON-lines manifest") from None


def _first_content_line(text: IO[str]) -> tuple[str | None, int]:
    for lineno, line in enumerate(text, 1):
        s = line.strip()
        if s and not s.startswith("#"):
            return s, lineno
    return None, 0


# ---------------------------------------------------------------- formats


def _from_npy(f: IO[bytes], path: str, fps: float | None) -> np.ndarray:
    try:
        arr = np.load(f, allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path}: not a plain numeric .npy array ({exc})") from None
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.ravel()
    if arr.ndim != 1:
        raise ValueError(f"{path}: lengths must be a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{path}: lengths must be numbers, got a {arr.dtype} array")
    return to_lengths(arr, path, fps, lambda i: f"element {i}")


def _from_text(text: IO[str], first: str, first_lineno: int, path: str, fps: float | None) -> np.ndarray:
    parts: list[np.ndarray] = []
    block: list[str] = [first]
    linenos: list[int] = [first_lineno]
    for lineno, line in enumerate(text, first_lineno + 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        block.append(s)
        linenos.append(lineno)
        if len(block) >= _BLOCK:
            parts.append(_parse_numbers(block, linenos, path, fps))
            block, linenos = [], []
    if block:
        parts.append(_parse_numbers(block, linenos, path, fps))
    return np.concatenate(parts)


def _parse_numbers(block: list[str], linenos: list[int], path: str, fps: float | None) -> np.ndarray:
    where = lambda i: f"line {linenos[i]}"  # noqa: E731
    if fps is None:
        try:  # exact for integers beyond 2**53, which float64 would round
            ints = np.array(block).astype(np.int64)
        except (ValueError, OverflowError):
            pass
        else:
            return to_lengths(ints, path, None, where)
    try:
        values = np.array(block).astype(np.float64)
    except ValueError:
        for i, s in enumerate(block):
            try:
                float(s)
            except ValueError:
                raise ValueError(f"{path} line {linenos[i]}: {s[:60]!r} is not a number; a text file holds one "
                                 "length per line (for JSON lines, each line must start with '{')") from None
        raise
    return to_lengths(values, path, fps, where)


def _from_jsonl(text: IO[str], first: str, first_lineno: int, path: str, field: str | None,
                fps: float | None) -> np.ndarray:
    record = _loads(first, path, first_lineno)
    keys = _field_path(record, field, path, first_lineno)
    values = array("d", [_lookup(record, keys, path, first_lineno)])  # 8 bytes a record, not a float object
    blank: list[int] = []
    for lineno, line in enumerate(text, first_lineno + 1):
        s = line.strip()
        if not s:
            blank.append(lineno)
            continue
        values.append(_lookup(_loads(s, path, lineno), keys, path, lineno))

    def where(i: int) -> str:
        line = first_lineno + i
        for b in blank:
            line += b <= line
        return f"line {line}, field {'.'.join(keys)!r}"

    return to_lengths(np.frombuffer(values, dtype=np.float64), path, fps, where)


def _from_json(data: str, path: str, field: str | None, fps: float | None) -> np.ndarray:
    try:
        items = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: a JSON file must hold a non-empty array of numbers or of objects")
    if isinstance(items[0], dict):
        keys = _field_path(items[0], field, path, None, what="element 0")
        values = [_lookup(x, keys, path, None, what=f"element {i}") for i, x in enumerate(items)]
    else:
        if field is not None:
            raise ValueError(f"{path} is a JSON array of numbers; --field only applies to arrays of objects")
        values = [_number(x, path, f"element {i}") for i, x in enumerate(items)]
    return to_lengths(np.asarray(values, dtype=np.float64), path, fps, lambda i: f"element {i}")


def _loads(line: str, path: str, lineno: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} line {lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None


def _field_path(record: Any, field: str | None, path: str, lineno: int | None,
                what: str | None = None) -> tuple[str, ...]:
    """The key path to read from every record, chosen from the first one."""
    where = what or f"line {lineno}"
    if not isinstance(record, dict):
        raise ValueError(f"{path} {where}: expected a JSON object, got {type(record).__name__}")
    if field is not None:
        if not field or field.startswith(".") or field.endswith("."):
            raise ValueError(f"--field must be a key or a dotted path like 'supervisions.0.duration', got {field!r}")
        return (field,) if field in record else tuple(field.split("."))
    for name in DURATION_FIELDS:
        if name in record:
            return (name,)
    shown = ", ".join(list(record)[:12])
    raise ValueError(f"{path} {where}: no {' or '.join(DURATION_FIELDS)} field (keys: {shown}); "
                     "pass --field NAME to choose one")


def _lookup(record: Any, keys: tuple[str, ...], path: str, lineno: int | None, what: str | None = None) -> float:
    where = what or f"line {lineno}"
    value = record
    for k in keys:
        if isinstance(value, dict) and k in value:
            value = value[k]
        elif isinstance(value, list) and k.lstrip("-").isdigit() and -len(value) <= int(k) < len(value):
            value = value[int(k)]
        else:
            raise ValueError(f"{path} {where}: no field {'.'.join(keys)!r}; every record needs it "
                             "(choose another with --field)")
    return _number(value, path, f"{where}, field {'.'.join(keys)!r}")


def _number(value: Any, path: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{path} {where}: {value!r} is not a number")
    return float(value)


# ---------------------------------------------------------------- conversion


def to_lengths(values: np.ndarray, path: str, fps: float | None, where) -> np.ndarray:
    """(N,) int64 lengths from numbers, seconds converted with ``fps``.

    where(i) names element i in error messages (``"line 7"``).
    """
    if values.size == 0:
        raise ValueError(f"{path} holds no lengths")
    if values.dtype.kind == "f":
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{path} {where(i)}: {float(values[i])!r} is not a valid length "
                             "(lengths are finite and >= 0)")
    elif (values < 0).any():
        i = int(np.flatnonzero(values < 0)[0])
        raise ValueError(f"{path} {where(i)}: {values[i]} is negative (lengths are >= 0)")
    if fps is not None:
        try:
            return seconds_to_frames(values, fps)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    if values.dtype.kind == "f":
        frac = values != np.floor(values)
        if frac.any():
            i = int(np.flatnonzero(frac)[0])
            raise ValueError(f"{path} {where(i)}: {float(values[i])!r} is fractional; "
                             "lengths are whole frames or tokens, "
                             "or pass --frames-per-second (e.g. 50) to convert seconds into frames")
    if (values >= 2**62).any():
        raise ValueError(f"{path}: a length of {values.max()} is too large for int64 planning; check the units")
    return values.astype(np.int64)
