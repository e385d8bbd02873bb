"""Where a sample's planning length comes from: a JSON field, an audio header,
or a function of the sample; seconds become frames by ``seconds_to_frames``."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.units import check_fps, seconds_to_frames
from .audio import NeedMoreBytes, audio_ext, audio_info


@dataclass(frozen=True)
class LengthSpec:
    """Where a sample's planning length comes from.

    ``json:FIELD`` (dotted path into the ``.json`` member), ``audio`` (frame
    count of the first audio member, from its header) or ``audio:SUFFIX``, or
    a function of the raw sample dict. With ``frames_per_second`` the value is
    seconds and the length is ``ceil(seconds * frames_per_second)``; without
    it the value must already be an integer count.
    """

    source: str
    field: tuple[str, ...] = ()
    suffix: str | None = None
    fn: Callable[[dict], Any] | None = None
    frames_per_second: float | None = None

    def describe(self) -> str:
        if self.source == "json":
            base = "json:" + ".".join(self.field)
        elif self.source == "audio":
            base = "audio" + (f":{self.suffix}" if self.suffix else "")
        else:
            base = f"fn:{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}"
        return base if self.frames_per_second is None else f"{base}*{self.frames_per_second:g}/s"

    def needs_all_members(self) -> bool:
        return self.source == "fn"

    def wants(self, suffix: str) -> bool:
        """Does computing the length need (part of) this member?"""
        if self.source == "json":
            return suffix == "json" or suffix.endswith(".json")
        if self.source == "audio":
            return (suffix == self.suffix) if self.suffix else audio_ext(suffix) is not None
        return True

    def to_length(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{where}: length source {self.describe()!r} gave {value!r}, not a number")
        v = float(value)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}: length source {self.describe()!r} gave {value!r}; lengths must be finite and >= 0")
        if self.frames_per_second is not None:
            try:
                return seconds_to_frames(v, self.frames_per_second)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        if v != math.floor(v):
            raise ValueError(
                f"{where}: length source {self.describe()!r} gave {value!r}, a fraction; pass "
                "frames_per_second (e.g. 50) to turn seconds into frame counts"
            )
        return int(v)


def length_spec(length_from: Any = "json:duration", frames_per_second: Any = None) -> LengthSpec:
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
        if length_from.startswith("audio:") and len(length_from) > 6:
            return LengthSpec("audio", suffix=length_from[6:].lower(), frames_per_second=fps)
    raise ValueError(
        f"length_from must be 'json:FIELD' (e.g. 'json:duration'), 'audio', 'audio:SUFFIX' or a function "
        f"of the sample dict, got {length_from!r}"
    )


def length_of(spec: LengthSpec, members: dict[str, bytes], sizes: dict[str, int], reread, where: str) -> int:
    if spec.source == "fn":
        return spec.to_length(spec.fn(members), where)
    if spec.source == "json":
        name = next((s for s in members if spec.wants(s)), None)
        if name is None:
            raise ValueError(f"{where}: no .json member to read {spec.describe()!r} from; choose another length_from")
        try:
            value = json.loads(members[name])
            for part in spec.field:
                value = value[part]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{where}: cannot read field {'.'.join(spec.field)!r} of member {name!r}: {exc!r}") from None
        return spec.to_length(value, where)
    name = next((s for s in members if spec.wants(s)), None)
    if name is None:
        raise ValueError(f"{where}: no audio member ({spec.suffix or '/'.join(('flac', 'wav', 'ogg', 'opus', 'mp3'))}) to measure")
    ext = audio_ext(name) or spec.suffix
    try:
        try:
            frames, rate = audio_info(members[name], ext, sizes[name])
        except NeedMoreBytes:
            frames, rate = audio_info(reread(name), ext, sizes[name])
    except (ValueError, RuntimeError) as exc:
        raise ValueError(f"{where}: cannot read the header of audio member {name!r}: {exc}") from None
    if spec.frames_per_second is None:
        return frames
    return spec.to_length(frames / rate, where)
