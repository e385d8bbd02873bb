"""The errors streaming failures surface as: ``ShardError`` for a shard that
cannot be read (``on_error="skip"`` may skip its samples), ``CacheError`` for
the machine's own disk (never skipped, never retried).

Stream: nothing: the exceptions the stages raise."""

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


class CacheError(OSError):
    """The node-local shard cache cannot be used: its disk is full (ENOSPC,
    EDQUOT), it is not writable (EACCES, EPERM, EROFS, ENOTDIR, EISDIR) or the
    process ran out of file descriptors or memory (EMFILE, ENFILE, ENOMEM).
    Not a ShardError: no sample is at fault, so ``on_error="skip"`` does not
    skip it and downloads are not retried. ``errno`` is the system's; the
    message names the cache directory, the bytes needed and free where they
    apply, and the setting that changes it (``cache_dir=``, ``prefetch_shards=``,
    ``prefetch_bytes=``, ``window_samples=``)."""

    # (message) or (errno, message): torch's DataLoader re-raises a worker's error as type(exc)(text)
    def __init__(self, *args, directory: str | None = None):
        super().__init__(*(scrub(a) if isinstance(a, str) else a for a in args))
        self.directory = directory

    def __str__(self) -> str:
        return str(self.strerror) if self.strerror is not None else super().__str__()
