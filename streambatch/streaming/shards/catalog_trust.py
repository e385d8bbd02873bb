"""What a catalog file may point at: the entries of a catalog are data, not commands.

A catalog (``streaming/shards/catalog_file.py``) lists every shard's URL and its sidecar's.
Whoever wrote the file chose those strings, and a ``pipe:`` URL is run with
``sh -c`` when a rank streams that shard; a local path in a catalog fetched
from a server is read from this machine's disk. So the entries of a catalog
pass this check before anything opens them:

- ``pipe:`` entries are refused, whatever the catalog's location;
- a catalog in object storage or on a web server (a *remote* catalog) may
  list only URLs of its own origin: the same scheme, host and port
  (``https://data.example:443``; for object stores the same bucket, with
  ``s3``/``s3a``, ``gs``/``gcs`` and the Azure schemes counting as one),
  never local paths or ``file:`` URLs. Every rank sends the user's
  ``storage_options`` (an ``Authorization`` header, say) to what the catalog
  lists: whoever can write a served catalog must not choose where that goes;
- a catalog on local disk may list local paths and any remote URL (the
  documented way to stream from an HTTP server, which takes no uploads, is a
  local catalog of ``https://`` shards).

``trust_catalog=True`` lifts every rule (for a catalog you wrote yourself);
a collection of schemes and origins (``{"pipe"}``, ``{"file", "https"}``,
``{"https://mirror.example:8443", "s3://other-bucket"}``) allows those on
top of the rules. Relative entries resolve against the catalog's own
location (local directory or URL), never against the current directory of
the process reading it (version 1 catalogs on local disk, which stored paths
as given to the indexer, keep their old meaning).

Stream: nothing: the check that refuses untrusted catalog entries."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection, Sequence
from typing import Any

from ...core.redact import scrub_url
from ..io.objects import is_remote, origin, protocol

TrustLike = bool | Collection[str]

_FAMILIES = ({"http", "https"}, {"s3", "s3a"}, {"gs", "gcs"}, {"az", "abfs", "abfss", "adl"})
_LOCAL = "file"  # the name a trust list uses for plain paths and file: URLs


class UntrustedCatalogError(ValueError):
    """A catalog lists an entry that its location does not allow (see the module docstring)."""


def check_trust(trust: Any) -> bool | frozenset[str]:
    """``trust_catalog`` as True, False or a frozenset of lower-case schemes and origins (``objects.origin``)."""
    if isinstance(trust, bool):
        return trust
    if isinstance(trust, str) or not isinstance(trust, Collection) or not all(isinstance(s, str) for s in trust):
        raise TypeError(f"trust_catalog must be True, False or a collection of URL schemes or origins such as "
                        f"{{'pipe'}} or {{'https://mirror.example:8443'}}, got {trust!r:.100}")
    return frozenset(origin(s) if "://" in s else s.lower().rstrip(":/") for s in trust)


def _scheme(url: str) -> str:
    """'pipe', 'file' (plain paths too) or the URL's lower-case scheme."""
    if url.startswith("pipe:"):
        return "pipe"
    return protocol(url) or _LOCAL


def _family(scheme: str) -> set[str]:
    return next((f for f in _FAMILIES if scheme in f), {scheme})


def _same_origin(a: str, b: str) -> bool:
    """Do URLs ``a`` and ``b`` go to the same server (http(s): scheme, host and port) or bucket (object stores,
    whose scheme aliases are one storage)?"""
    pa, pb = _scheme(a), _scheme(b)
    if pa in ("http", "https") or pb in ("http", "https"):
        return origin(a) == origin(b)
    return pb in _family(pa) and origin(a).partition("://")[2] == origin(b).partition("://")[2]


def _has_scheme(entry: str) -> bool:
    return entry.startswith("pipe:") or protocol(entry) != "" or entry == "-"


def resolve(catalog: str, entry: str, version: int) -> str:
    """``entry`` of the catalog at ``catalog`` as an absolute URL or path
    (relative entries joined to the catalog's directory; see the module docstring)."""
    if _has_scheme(entry) or os.path.isabs(entry):
        return entry
    if is_remote(catalog):
        base = catalog.split("?", 1)[0].rsplit("/", 1)[0]
        scheme, sep, rest = base.partition("://")
        host, _, path = rest.partition("/")
        joined = posixpath.normpath(posixpath.join("/" + path, entry))
        return f"{scheme}{sep}{host}{joined}"
    if version < 2:
        return entry  # a version 1 catalog stored shard paths as the indexer was given them
    return os.path.normpath(os.path.join(os.path.dirname(catalog), entry))


def refusal(catalog: str, url: str, trust: bool | frozenset[str]) -> str | None:
    """Why the catalog at ``catalog`` may not list ``url``, or None if it may."""
    if trust is True:
        return None
    allowed = trust or frozenset()
    scheme = _scheme(url)
    if scheme in allowed or (origin(url) and origin(url) in allowed):
        return None
    if scheme == "pipe":
        return "a pipe: command, which would be run with sh -c when a rank streams that shard"
    if not is_remote(catalog):
        return None  # a catalog on this machine's disk may list paths and any remote URL
    if scheme == _LOCAL:
        return "a path on this machine's disk, listed by a catalog that is not on it"
    own = _scheme(catalog)
    if scheme not in _family(own) and not {scheme, own} <= {"http", "https"}:
        return f"a {scheme}:// URL, listed by a catalog in {own}:// storage"
    if not _same_origin(catalog, url):
        return (f"a URL of another origin ({origin(url)}), listed by a catalog on {origin(catalog)}: every rank "
                "would send it your storage_options (credentials included)")
    return None


def resolve_entries(catalog: str, entries: Sequence[str], *, version: int, trust: bool | frozenset[str],
                    what: str) -> list[str]:
    """Every entry resolved (``resolve``) and checked (``refusal``); the first
    refused one is an ``UntrustedCatalogError`` naming it and the way out.
    ``what``: the kind of entry, for the message ("shard", "sidecar")."""
    out = [resolve(catalog, e, version) for e in entries]
    for i, url in enumerate(out):
        why = refusal(catalog, url, trust)
        if why is not None:
            scheme = _scheme(url)
            narrow = origin(url) if "origin" in why else scheme  # the least trust that allows this entry
            raise UntrustedCatalogError(
                f"catalog {scrub_url(catalog)} lists {what} {i} as {scrub_url(url)!r}: {why}. streambatch "
                f"treats a catalog's entries as data; if you wrote this catalog (or trust who did), pass "
                f"trust_catalog=True to StreamingBatches or open_catalog (or trust_catalog={{{narrow!r}}} for just "
                f"these), else rebuild it with `streambatch index` from URLs you chose")
    return out


def relative_entries(catalog: str, entries: Sequence[str]) -> list[str]:
    """Entries as a version 2 catalog at ``catalog`` stores them: relative
    local paths made relative to the catalog's directory (so ``resolve`` gives
    back the same files from any working directory); everything else as is."""
    if is_remote(catalog):
        return list(entries)
    here = os.path.dirname(os.path.abspath(catalog))
    return [e if _has_scheme(e) or os.path.isabs(e) else os.path.relpath(os.path.abspath(e), here)
            for e in entries]
