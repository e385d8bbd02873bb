"""The error every streaming failure surfaces as."""

from __future__ import annotations

from ..core.redact import scrub


class ShardError(ValueError):
    """A shard cannot be read as its sidecar describes: corrupt or truncated
    tar, a sidecar that no longer matches, or an unreadable URL. The message
    names the shard and, where it applies, the byte offset; it is scrubbed of
    credentials (``redact.py``) however it was formatted."""

    # a failed remote download: (path, bytes) of the part that did arrive, if any (see cache.py)
    partial: tuple[str, int] | None = None

    def __init__(self, *args: object) -> None:
        super().__init__(*(scrub(a) if isinstance(a, str) else a for a in args))
