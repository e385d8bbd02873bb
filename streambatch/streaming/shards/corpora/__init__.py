"""Corpus formats: one module each, one registry line each.

``FORMATS`` maps a format's name (``format="shar"``) to its ``CorpusFormat``
(``base.py``); ``resolve`` picks the format of what a user passed: a spec
object (``Shar(...)``, ``NemoTarred(...)``, ``Parquet(...)``), a name given
with ``format=``, or the first format whose ``claims`` recognises a string
or list (a directory of cuts files, a ``.json`` manifest, ``.parquet``
files); anything else is WebDataset tars. A new format is a module with a
spec class (``shard_urls(settings)``, ``open(settings) -> Catalog``), a
``Layout`` and ``FORMAT = CorpusFormat(...)``, plus its line below (or
``register_format`` from outside the package).

Stream: nothing: the registry of corpus formats."""

from __future__ import annotations

from typing import Any

from . import nemo, parquet, shar, webdataset
from .base import CorpusFormat, Layout, OpenSettings, SampleTable
from .nemo import NemoTarred
from .parquet import Parquet
from .shar import Shar
from .webdataset import WebDataset

FORMATS: dict[str, CorpusFormat] = {}


def register_format(fmt: CorpusFormat) -> CorpusFormat:
    """Add a corpus format (by its name; a second one of a name replaces the first). Returns it."""
    if not isinstance(fmt, CorpusFormat):
        raise TypeError(f"register_format takes a CorpusFormat, got {type(fmt).__name__}")
    FORMATS[fmt.name] = fmt
    return fmt


register_format(webdataset.FORMAT)  # the fallback: tars with sidecars
register_format(shar.FORMAT)
register_format(nemo.FORMAT)
register_format(parquet.FORMAT)


def get_format(name: str) -> CorpusFormat:
    """The format named ``name``, or a ValueError listing the known ones."""
    if not isinstance(name, str) or name not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)} (or None: detected from what you pass), "
                         f"got {name!r}")
    return FORMATS[name]


def resolve(given: Any, name: str | None = None) -> tuple[CorpusFormat, Any]:
    """(format, spec object) of what a user passed as ``urls`` (``name``: the format, when named)."""
    if name is not None:
        fmt = get_format(name)
        if not isinstance(given, fmt.spec) and any(isinstance(given, f.spec) for f in FORMATS.values()):
            raise ValueError(f"format={name!r} but urls is a {type(given).__name__}(...); drop format= or pass "
                             "the files as a string or list")
        return fmt, fmt.make(given)
    for fmt in FORMATS.values():
        if isinstance(given, fmt.spec):
            return fmt, given
    for fmt in FORMATS.values():
        if fmt.name != "webdataset" and fmt.claims(given):
            return fmt, fmt.make(given)
    fmt = FORMATS["webdataset"]
    return fmt, fmt.make(given)


__all__ = ["FORMATS", "CorpusFormat", "Layout", "NemoTarred", "OpenSettings", "Parquet", "SampleTable", "Shar",
           "WebDataset", "get_format", "register_format", "resolve"]
