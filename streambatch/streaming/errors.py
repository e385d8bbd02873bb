"""The error every streaming failure surfaces as."""

from __future__ import annotations


class ShardError(ValueError):
    """A shard cannot be read as its sidecar describes: corrupt or truncated
    tar, a sidecar that no longer matches, or an unreadable URL. The message
    names the shard and, where it applies, the byte offset."""

    # a failed remote download: (path, bytes) of the part that did arrive, if any (see cache.py)
    partial: tuple[str, int] | None = None
