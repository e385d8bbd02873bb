"""Shard URLs: expanding brace patterns into a list (webdataset's
``expand_urls``, so brace patterns, ``file:``, ``pipe:`` and ``http(s):``
behave as they do there), telling local files from the rest, and naming
the file a URL refers to.

Stream: nothing: URL lists and answers about one URL."""

from __future__ import annotations

import errno
import glob
import os
import re
from urllib.parse import urlparse

from webdataset.shardlists import expand_urls as wds_expand_urls

from ...core.redact import scrub

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")  # what a directory's shards end in (compressed ones are refused later)
_GLOB = re.compile(r"[*?\[]")


def expand_urls(urls) -> list[str]:
    """Shard URLs from a brace pattern (``"a-{000..009}.tar"``), a path, or a
    list of either, in the given order. Local paths may also be glob patterns
    (``"data/train-*.tar"``: the matching files, sorted) or directories (every
    shard under them, at any depth, sorted), as on the command line."""
    if isinstance(urls, os.PathLike):
        urls = os.fspath(urls)
    if isinstance(urls, str):
        out = [x for u in wds_expand_urls(urls) for x in _local_expansion(u)]
    elif isinstance(urls, (list, tuple)):
        out = []
        for u in urls:
            if isinstance(u, os.PathLike):
                u = os.fspath(u)
            if not isinstance(u, str):
                raise TypeError(f"shard URLs must be strings or paths, got {u!r} ({type(u).__name__})")
            out.extend(x for v in wds_expand_urls(u) for x in _local_expansion(v))
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


def _local_expansion(url: str) -> list[str]:
    """A plain local path that is a directory -> its shards; a glob pattern that names no file itself -> the
    files it matches; anything else (URLs, pipe: commands, ordinary paths) as it is."""
    if not is_local(url) or url.startswith("file:"):
        return [url]
    if os.path.isdir(url):
        return shards_under(url)
    if _GLOB.search(url) and not os.path.lexists(url):
        found = sorted(p for p in glob.glob(url, recursive=True) if not os.path.isdir(p))
        if not found:
            raise FileNotFoundError(errno.ENOENT, scrub(f"no file matches the pattern {url!r}; check the directory "
                                                        "and the pattern (globs such as 'train-*.tar' and brace "
                                                        "ranges such as 'train-{000000..000099}.tar' both work)"),
                                    scrub(url))
        return found
    return [url]


def shards_under(directory: str) -> list[str]:
    """Every shard file under ``directory`` (its subdirectories too), in path order; hidden files (a writer's
    temporary files) left out. ValueError when there is none."""
    found = sorted(os.path.join(folder, n) for folder, _, names in os.walk(directory)
                   for n in names if n.endswith(SHARD_SUFFIXES) and not n.startswith("."))
    if not found:
        raise ValueError(scrub(f"{directory} is a directory without .tar shards (its subdirectories included); pass "
                               "shard paths, a pattern like 'train-{000000..000099}.tar' or 'train-*.tar', or a "
                               "directory that holds shards"))
    return found


def padding_fix(pattern: str) -> str | None:
    """``pattern`` with its unpadded brace ranges written with the zero padding of the files that exist
    (``train-{0..7}.tar`` -> ``train-{000000..000007}.tar`` when ``train-000000.tar`` is there), or None when
    that is not the mistake. Brace ranges keep the digits they are written with, so ``{0..7}`` names
    ``train-0.tar``."""
    ranges = list(_RANGE.finditer(pattern))
    if not ranges or not is_local(pattern):
        return None
    # the files the pattern's shape could name: each range a run of digits
    parts, last = [], 0
    for m in ranges:
        parts.append(re.escape(pattern[last:m.start()]))
        parts.append(r"(\d+)")
        last = m.end()
    parts.append(re.escape(pattern[last:]))
    shape = re.compile("".join(parts) + r"\Z")
    parent = os.path.dirname(pattern[: ranges[0].start()])  # the folder the first range's files are in
    try:
        names = [os.path.join(parent, n) for n in os.listdir(local_path(parent) or ".")]
    except OSError:
        return None
    widths: list[set[int]] = [set() for _ in ranges]
    for name in names:
        hit = shape.match(name)
        if hit:
            for i, digits in enumerate(hit.groups()):
                widths[i].add(len(digits))
    out, last, changed = [], 0, False
    for m, seen in zip(ranges, widths):
        lo, hi = m.group(1), m.group(2)
        out.append(pattern[last:m.start()])
        wide = max(seen) if len(seen) == 1 else None
        if wide is not None and wide > max(len(lo), len(hi)):
            out.append(f"{{{int(lo):0{wide}d}..{int(hi):0{wide}d}}}")
            changed = True
        else:
            out.append(m.group(0))
        last = m.end()
    out.append(pattern[last:])
    fixed = "".join(out)
    return fixed if changed and os.path.exists(wds_expand_urls(fixed)[0]) else None


_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")


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
