"""The ``streambatch index`` command an error suggests, with the flags it needs.

A hint must work when pasted. When the caller said how lengths are made
(``length_from``/``frames_per_second``) the command repeats it; when not,
the first sample of the first local shard is looked at (a few tar headers
and one small member, with the standard library's ``tarfile``) to choose
between the default (``json:duration`` as an integer count), seconds that
need ``--frames-per-second``, and audio headers (``--length-from audio``).

Stream: (shard URLs, how lengths are made) -> one shell command line.
"""

from __future__ import annotations

import json
import os
import shlex
import tarfile

from ..formats.audio import audio_ext
from ..io.urls import is_local, local_path
from .lengths import LengthSpec

# The frame rate a hint proposes for durations in seconds: 20 ms frames, common for speech models. The message
# says it is a choice: lengths are ceil(seconds x fps) in the units of max_batch_tokens.
HINT_FPS = 50
_PEEK_MEMBERS = 16  # tar members looked at to find the first sample's members


def index_command(target: str, *, force: bool = False, index_dir: str | None = None, spec=None,
                  probe: str | None = None) -> tuple[str, str]:
    """(command, note): the ``streambatch index`` line for ``target`` (a pattern or
    a path, quoted for the shell) and a short note on the flags it chose ('' if none).

    spec: the caller's ``LengthSpec`` (its flags are repeated), or None: then the
    first sample of ``probe`` (a shard URL) decides.
    """
    flags = " --force" if force else ""
    if index_dir:
        flags += f" --index-dir {quote(index_dir)}"
    note = ""
    if spec is not None:
        flags += spec_flags(spec)
    elif probe is not None:
        extra, note = _probe_flags(probe)
        flags += extra
    return f"streambatch index{flags} {quote(target)}", note


def quote(text: str) -> str:
    """Single quotes, so that a brace pattern reaches streambatch unexpanded by the shell."""
    return f"'{text}'" if "'" not in text else shlex.quote(text)


def spec_flags(spec) -> str:
    """The command-line spelling of a ``LengthSpec`` ('' for a Python function)."""
    return described_flags(spec.describe(), explicit=True)


def described_flags(described: str | None, explicit: bool = False) -> str:
    """The flags that make lengths as a recorded ``length_from`` says (``"json:duration*50/s"`` ->
    `` --length-from json:duration --frames-per-second 50``); '' for None or a Python function.
    Without ``explicit`` the default source (``json:duration``) is left out."""
    parsed = LengthSpec.parse_described(described) if described else None
    if parsed is None:
        return ""
    source, fps = parsed
    flags = f" --length-from {source}" if explicit or source != "json:duration" else ""
    if fps is not None:
        flags += f" --frames-per-second {fps:g}"
    return flags


def _probe_flags(url: str) -> tuple[str, str]:
    """Flags for indexing shards like ``url`` with the defaults where they work."""
    members = _first_sample(url)
    if not members:
        return "", ""
    secs = f"--frames-per-second {HINT_FPS}: lengths are ceil(seconds x {HINT_FPS}), in the units of max_batch_tokens"
    data = next((v for k, v in members.items() if k == "json" or k.endswith(".json")), None)
    if data is not None:
        try:
            value = json.loads(data).get("duration")
        except (ValueError, AttributeError, RecursionError):
            value = None
        if isinstance(value, int) and not isinstance(value, bool):
            return "", ""  # integer counts: the defaults index them
        if isinstance(value, float):
            return f" --frames-per-second {HINT_FPS}", f"its json duration is in seconds; {secs}"
    if any(audio_ext(k) for k in members):
        return (f" --length-from audio --frames-per-second {HINT_FPS}",
                f"its samples have no json duration, so lengths come from the audio headers; {secs}")
    return "", ""


def _first_sample(url: str) -> dict[str, bytes]:
    """suffix -> bytes (json members; audio members are only named) of the first
    sample of a local shard; {} when it cannot be read (the hint then stays plain)."""
    if not is_local(url) or not os.path.isfile(local_path(url)):
        return {}
    out: dict[str, bytes] = {}
    key = None
    try:
        with tarfile.open(local_path(url), "r:") as tar:
            for _ in range(_PEEK_MEMBERS):
                info = tar.next()
                if info is None:
                    break
                if not info.isfile():
                    continue
                name = os.path.basename(info.name)
                base, _, suffix = name.partition(".")
                if key is None:
                    key = base
                elif base != key:
                    break
                small = suffix == "json" or suffix.endswith(".json")
                out[suffix] = tar.extractfile(info).read(1 << 16) if small else b""
    except (OSError, tarfile.TarError, EOFError):
        return {}
    return out
