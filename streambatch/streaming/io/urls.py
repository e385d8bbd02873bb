"""Shard URLs: expanding brace patterns into a list (webdataset's
``expand_urls``, so brace patterns, ``file:``, ``pipe:`` and ``http(s):``
behave as they do there), telling local files from the rest, and naming
the file a URL refers to.

Stream: nothing: URL lists and answers about one URL."""

from __future__ import annotations

import os
import re
from urllib.parse import urlparse

from webdataset.shardlists import expand_urls as wds_expand_urls

from ...core.redact import scrub


def expand_urls(urls) -> list[str]:
    """Shard URLs from a brace pattern (``"a-{000..009}.tar"``), a path, or a
    list of either, in the given order."""
    if isinstance(urls, os.PathLike):
        urls = os.fspath(urls)
    if isinstance(urls, str):
        out = wds_expand_urls(urls)
    elif isinstance(urls, (list, tuple)):
        out = []
        for u in urls:
            if isinstance(u, os.PathLike):
                u = os.fspath(u)
            if not isinstance(u, str):
                raise TypeError(f"shard URLs must be strings or paths, got {u!r} ({type(u).__name__})")
            out.extend(wds_expand_urls(u))
    else:
        raise TypeError(
            f"urls must be a brace pattern string or a list of shard URLs, got {type(urls).__name__}"
        )
    if not out:
        raise ValueError("the shard list is empty; pass shard paths or a pattern like 'train-{000000..000099}.tar'")
    seen = set()
    for u in out:
        if u in seen:
            raise ValueError(f"shard {u!r} is listed twice; its samples would be trained on twice. "
                             "Remove the duplicate")
        seen.add(u)
    return out


def is_local(url: str) -> bool:
    """True for plain paths and ``file:`` URLs: the shards we can seek in."""
    if url == "-":
        return False
    scheme = urlparse(url).scheme
    return scheme == "" or scheme == "file" or (len(scheme) == 1 and os.name == "nt")


def local_path(url: str) -> str:
    return re.sub(r"^file://?", "/", url) if url.startswith("file:") else url


def url_basename(url: str) -> str:
    """The file name a URL refers to; for ``pipe:cmd ... path`` the last word."""
    if url.startswith("pipe:"):
        url = url[5:].split()[-1].strip("'\"") if url[5:].split() else ""
    path = urlparse(url).path if not is_local(url) else local_path(url)
    name = os.path.basename(path.rstrip("/"))
    if not name:
        raise ValueError(scrub(f"cannot name a sidecar for shard URL {url!r}: it has no file name; "
                               "pass index_dir and a URL ending in the shard's name"))
    return name
