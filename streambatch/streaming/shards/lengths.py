"""Where a sample's planning length comes from: a JSON field, an audio header,
a Parquet column, or a function of the sample; seconds become frames by ``seconds_to_frames``.

Stream: one length per sample (from a JSON field, an audio header or a function)."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.types import LengthFrom
from ...core.units import MAX_LENGTH, check_fps, seconds_to_frames
from ..formats.audio import AUDIO_EXTS, NeedMoreBytes, audio_ext, audio_info


@dataclass(frozen=True)
class LengthSpec:
    """Where a sample's planning length comes from.

    ``json:FIELD`` (dotted path into the ``.json`` member; for Lhotse Shar
    and NeMo corpora into each cut / manifest entry), ``audio`` (frame count
    of the first audio member, from its header) or ``audio:SUFFIX``,
    ``column:NAME`` (a Parquet column, read alone), or a function of the raw
    sample dict. With ``frames_per_second`` the value is
    seconds and the length is ``ceil(seconds * frames_per_second)``; without
    it the value must already be an integer count.
    """

    source: str
    field: tuple[str, ...] = ()
    suffix: str | None = None
    fn: Callable[[dict[str, bytes]], float] | None = None
    frames_per_second: float | None = None

    def describe(self) -> str:
        if self.source == "json":
            base = "json:" + ".".join(self.field)
        elif self.source == "audio":
            base = "audio" + (f":{self.suffix}" if self.suffix else "")
        elif self.source == "column":
            base = "column:" + self.field[0]
        else:
            base = f"fn:{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}"
        return base if self.frames_per_second is None else f"{base}*{self.frames_per_second:g}/s"

    @staticmethod
    def parse_described(described: str) -> tuple[str, float | None] | None:
        """The inverse of ``describe`` for the command line: ``"json:duration*50/s"`` ->
        ``("json:duration", 50.0)``, ``"audio"`` -> ``("audio", None)``; None for a
        Python function (``"fn:..."``), which has no command-line spelling."""
        if described.startswith("fn:"):
            return None
        source, _, rate = described.partition("*")
        return source, float(rate[:-2]) if rate.endswith("/s") else None

    def needs_all_members(self) -> bool:
        return self.source == "fn"

    def wants(self, suffix: str) -> bool:
        """Does computing the length need (part of) this member?"""
        if self.source == "column":  # a Parquet column: tar members never hold it
            raise ValueError(f"length_from={self.describe()!r} names a Parquet column; tar shards take "
                             "'json:FIELD', 'audio' or a function")
        if self.source == "json":
            return suffix == "json" or suffix.endswith(".json")
        if self.source == "audio":
            return (suffix == self.suffix) if self.suffix else audio_ext(suffix) is not None
        return True

    def to_length(self, value: Any, where: str) -> int:
        """``value`` (seconds with ``frames_per_second``, else a count) as a
        length in [0, 2**62); anything else is a one-line ValueError that
        starts with ``where`` (the shard and sample)."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{where}: length source {self.describe()!r} gave {_show(value)}, not a number")
        try:
            v = float(value)
        except OverflowError:  # an int beyond the float range
            v = math.inf
        if math.isnan(v) or v < 0 or (math.isinf(v) and not isinstance(value, numbers.Integral)):
            raise ValueError(f"{where}: length source {self.describe()!r} gave {_show(value)}; lengths must be "
                             "finite and >= 0")
        if self.frames_per_second is not None:
            try:
                if math.isinf(v):
                    raise ValueError(f"a duration of {_show(value)} s is beyond any limit")
                return seconds_to_frames(v, self.frames_per_second)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        exact = int(value) if isinstance(value, numbers.Integral) else None
        if exact is None and v != math.floor(v):
            raise ValueError(
                f"{where}: length source {self.describe()!r} gave {_show(value)}, a fraction; pass "
                "frames_per_second (e.g. 50) to turn seconds into frame counts"
            )
        n = exact if exact is not None else int(v)
        if n >= MAX_LENGTH:
            raise ValueError(f"{where}: length source {self.describe()!r} gave {_show(value)}, beyond the limit "
                             "of 2**62; check the units (a count of frames or tokens is expected, or pass "
                             "frames_per_second for seconds)")
        return n


def _no_field(where: str, spec: LengthSpec, member: str, part: str, found: dict, sizes: dict[str, int]) -> str:
    """The error for a json member without the field ``length_from`` names: its fields, and what to pass."""
    fields = sorted(map(str, found))
    shown = fields[:12] + (["..."] if len(fields) > 12 else [])
    fix = "name the field that holds each sample's length with length_from='json:FIELD' (--length-from json:FIELD)"
    if any(audio_ext(s) for s in sizes):
        fix += (", or measure the audio headers: length_from='audio', frames_per_second=50 "
                "(--length-from audio --frames-per-second 50)")
    return (f"{where}: cannot read field {'.'.join(spec.field)!r} of member {member!r}: it has no field {part!r} "
            f"(its fields: {shown}); {fix}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def length_spec(length_from: LengthFrom = "json:duration", frames_per_second: float | None = None) -> LengthSpec:
    """Validate ``length_from`` / ``frames_per_second`` into a LengthSpec."""
    if isinstance(length_from, LengthSpec):
        return length_from
    fps = check_fps(frames_per_second)
    if callable(length_from):
        return LengthSpec("fn", fn=length_from, frames_per_second=fps)
    if isinstance(length_from, str):
        if length_from.startswith("json:") and len(length_from) > 5:
            return LengthSpec("json", field=tuple(length_from[5:].split(".")), frames_per_second=fps)
        if length_from == "audio":
            return LengthSpec("audio", frames_per_second=fps)
        if length_from.startswith("column:") and len(length_from) > 7:
            return LengthSpec("column", field=(length_from[7:],), frames_per_second=fps)
        if length_from.startswith("audio:") and len(length_from) > 6:
            suffix = length_from[6:].lower()
            if audio_ext(suffix) is None:
                # every suffix measured here must also decode with decode="audio"
                raise ValueError(
                    f"length_from={length_from!r}: {suffix.rsplit('.', 1)[-1]!r} is not an audio format that "
                    f"decode='audio' reads ({', '.join(AUDIO_EXTS)}); measure other members with a function "
                    "of the sample as length_from")
            return LengthSpec("audio", suffix=suffix, frames_per_second=fps)
    raise ValueError(
        f"length_from must be 'json:FIELD' (e.g. 'json:duration'), 'audio', 'audio:SUFFIX', 'column:NAME' "
        f"(a Parquet column) or a function of the sample dict, got {length_from!r}"
    )


def length_of(spec: LengthSpec, members: dict[str, bytes], sizes: dict[str, int], reread, where: str) -> int:
    """The planning length of one sample; ``where`` names its shard and key.

    members: suffix -> the bytes read (whole, or a head for audio on files);
    sizes: suffix -> member size; reread(suffix) -> the whole member. Every
    failure is a one-line ValueError starting with ``where``.
    """
    if spec.source == "fn":
        try:
            value = spec.fn(members)
        except Exception as exc:  # the user's function: report it with the sample it failed on
            raise ValueError(f"{where}: the length function {spec.describe()!r} raised {exc!r}") from exc
        return spec.to_length(value, where)
    if spec.source == "json":
        name = next((s for s in members if spec.wants(s)), None)
        if name is None:
            raise ValueError(f"{where}: no .json member to read {spec.describe()!r} from; choose another length_from")
        try:
            value = json.loads(members[name])
            for part in spec.field:
                if isinstance(value, dict) and part not in value:
                    raise ValueError(_no_field(where, spec, name, part, value, sizes))
                value = value[part]
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            if str(exc).startswith(where):
                raise
            raise ValueError(f"{where}: cannot read field {'.'.join(spec.field)!r} of member {name!r}: "
                             f"{_show(exc)}") from None
        return spec.to_length(value, where)
    name = next((s for s in members if spec.wants(s)), None)
    if name is None:
        want = f"a .{spec.suffix} member" if spec.suffix else f"a member with an audio suffix ({', '.join(AUDIO_EXTS)})"
        raise ValueError(f"{where}: no audio member to measure: the sample has {sorted(sizes)}, not {want}")
    ext = audio_ext(name)
    try:
        try:
            frames, rate = audio_info(members[name], ext, sizes[name])
        except NeedMoreBytes:
            if len(members[name]) >= sizes[name]:
                raise  # it was the whole member already
            frames, rate = audio_info(reread(name), ext, sizes[name])
    except NeedMoreBytes:
        raise ValueError(f"{where}: audio member {name!r} is truncated: its header runs past the member's "
                         f"{sizes[name]} bytes") from None
    except Exception as exc:  # parsers and soundfile on untrusted bytes
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"{where}: cannot read the header of audio member {name!r}: {msg}") from None
    if spec.frames_per_second is None:
        return spec.to_length(frames, where)
    return spec.to_length(frames / rate, where)
