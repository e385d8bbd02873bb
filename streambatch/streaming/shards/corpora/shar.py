"""Lhotse Shar: per shard a ``cuts.NNNNNN.jsonl.gz`` (each cut's JSON, with
its ``duration``) and one tar per field, e.g. ``recording.NNNNNN.tar``,
holding the cuts' data in the same order: per cut a data member
``<cut id>.<ext>`` (``.nodata`` when the cut has none) followed by a
``<cut id>.json`` member with the field's manifest (``.nometa``), as lhotse's
``SharWriter`` writes them.

Lengths come from the cuts files alone (``length_from="json:duration"`` with
``frames_per_second``: any field of the cut's JSON); the audio is never read
to plan. A rank reads its cuts' members by offset: the tar's member headers
are scanned when a pass first needs the shard (a local file seeks from header
to header; a remote one costs about one small ranged GET per cut), and the
cuts file is read again to give each sample its cut.

A sample is ``{"__key__": cut id, "__url__": tar URL, "<field>.<ext>": data
bytes, "<field>.json": the field's manifest, "cut.json": the cut}``; with
``decode="audio"`` the audio becomes (tensor (C, T), rate) and both JSONs
dicts.

Stream: a Shar corpus as a ``Catalog`` (cuts' lengths) and its samples' tar bytes -> sample dicts."""

from __future__ import annotations

import gzip
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....core.redact import scrub_url
from ...errors import ShardError
from ...io.objects import is_remote
from ...io.urls import expand_urls, is_local, local_path
from ..catalog import Catalog
from .base import (
    CorpusFormat,
    Layout,
    OpenSettings,
    SampleTable,
    check_counts,
    digest,
    json_bytes,
    json_lines,
    lengths_of,
    list_dir,
    narrow,
    read_object,
    scan_members,
    tar_members,
)

_SHARD = re.compile(r"^(?P<field>[^.]+)\.(?P<num>\d+)\.(?P<ext>.+)$")
_NO_DATA = ("nodata", "nometa")


@dataclass(frozen=True)
class Shar:
    """A Lhotse Shar corpus, as ``lhotse.CutSet.from_shar`` takes it.

    in_dir: the directory ``SharWriter`` wrote (local, or an fsspec URL that
        lists: ``s3://``, ``gs://``, ``hf://``); or
    fields: ``{"cuts": [...], "recording": [...]}``: the files of each field
        (lists or brace patterns), shard after shard, as for lhotse;
    audio_field: the tar field read with each cut (default ``"recording"``;
        any field ``SharWriter`` wrote, e.g. ``"features"``).
    """

    in_dir: str | None = None
    fields: dict[str, Any] | None = None
    audio_field: str = "recording"

    def __post_init__(self) -> None:
        if (self.in_dir is None) == (self.fields is None):
            raise ValueError("Shar takes in_dir (a directory written by lhotse's SharWriter) or fields "
                             "({'cuts': [...], 'recording': [...]}), not both and not neither")
        if self.fields is not None and (not isinstance(self.fields, dict) or "cuts" not in self.fields
                                        or self.audio_field not in self.fields):
            raise ValueError(f"Shar fields must be a dict with 'cuts' and {self.audio_field!r} (the files of "
                             f"each, shard after shard), got {self.fields!r}")

    def files(self, settings: OpenSettings) -> tuple[list[str], list[str]]:
        """(cuts files, the audio field's tars), one of each per shard, in shard order."""
        if self.fields is not None:
            cuts, tars = expand_urls(self.fields["cuts"]), expand_urls(self.fields[self.audio_field])
        else:
            found: dict[str, dict[int, str]] = {}
            for url in list_dir(self.in_dir, settings.storage_options):
                m = _SHARD.match(url.rstrip("/").rsplit("/", 1)[-1])
                if m is None:
                    continue
                if (m["field"] == "cuts" and m["ext"].startswith("jsonl")) or m["field"] == self.audio_field:
                    found.setdefault(m["field"], {})[int(m["num"])] = url
            cuts_by, tars_by = found.get("cuts", {}), found.get(self.audio_field, {})
            if not cuts_by:
                raise FileNotFoundError(f"no Shar cuts files (cuts.NNNNNN.jsonl.gz) in {scrub_url(self.in_dir)}; "
                                        "pass the directory lhotse's SharWriter wrote")
            if sorted(cuts_by) != sorted(tars_by):
                missing = sorted(set(cuts_by) ^ set(tars_by))[:3]
                raise FileNotFoundError(f"Shar directory {scrub_url(self.in_dir)}: cuts and {self.audio_field} "
                                        f"shards do not pair up (shard numbers {missing} have only one of them); "
                                        "is audio_field right?")
            cuts, tars = [cuts_by[k] for k in sorted(cuts_by)], [tars_by[k] for k in sorted(tars_by)]
        if len(cuts) != len(tars):
            raise ValueError(f"Shar: {len(cuts)} cuts files but {len(tars)} {self.audio_field} tars; they pair up "
                             "shard by shard")
        for t in tars:
            if not t.split("?", 1)[0].endswith(".tar"):
                raise ValueError(f"Shar shard {scrub_url(t)} is not a plain .tar (a compressed tar cannot be read "
                                 "by member offsets); write the corpus with SharWriter's default .tar")
        return cuts, tars

    def shard_urls(self, settings: OpenSettings) -> list[str]:
        return self.files(settings)[1]

    def open(self, settings: OpenSettings) -> Catalog:
        """The catalog: every cut's length from the cuts files; no tar is opened."""
        cuts, tars = self.files(settings)
        spec = settings.spec("json:duration")

        def one(i: int) -> tuple[list[str], np.ndarray]:
            records = list(read_cuts(cuts[i], settings.storage_options, settings.retry))
            where = lambda j: f"Shar cuts file {scrub_url(cuts[i])}, cut {j}"  # noqa: E731
            return [str(r.get("id")) for r in records], lengths_of(records, spec, where)

        with ThreadPoolExecutor(16 if any(is_remote(c) for c in cuts) else 1) as pool:
            loaded = list(pool.map(one, range(len(cuts))))
        layout = SharLayout(self.audio_field, settings.storage_options, settings.retry, spec.describe())
        counts = np.array([len(ids) for ids, _ in loaded], dtype=np.int64)
        lengths = np.concatenate([lens for _, lens in loaded]) if loaded else np.zeros(0, np.int64)
        digests = tuple(digest(np.array(ids, dtype=object).astype(str), lens) for ids, lens in loaded)
        return Catalog(tuple(tars), tuple(cuts), counts, digests, narrow(lengths),
                       np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                       storage_options=settings.storage_options, layouts=(layout,) * len(tars))


def read_cuts(url: str, storage_options: dict | None = None, retry=None):
    """The cut dicts of one cuts file (``.jsonl.gz`` or ``.jsonl``), in order."""
    data = read_object(url, storage_options, retry, "Shar cuts file")
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json_lines(data, f"Shar cuts file {scrub_url(url)}")


class SharLayout(Layout):
    """Reads the samples of Shar shards: one field's tar, its cuts file beside it."""

    name = "shar"

    def __init__(self, field: str, storage_options: dict | None, retry, length_from: str):
        self.field, self.storage_options, self.retry, self.length_from = field, storage_options, retry, length_from

    def table(self, catalog: Catalog, shard: int, copy: str | None = None) -> SampleTable:
        url, cuts_url = catalog.urls[shard], catalog.sidecars[shard]
        try:
            cuts = [c for c in read_cuts(copy or cuts_url, self.storage_options, self.retry)]
            members = scan_members(url, self.storage_options, self.retry)
        except (OSError, ValueError) as exc:
            if isinstance(exc, ShardError):
                raise
            raise ShardError(f"cannot read Shar shard {url} (cuts {cuts_url}): {exc}") from exc
        if len(members) % 2:
            raise ShardError(f"Shar shard {url} has an odd number of members ({len(members)}): each cut has a "
                             "data member and a manifest member")
        keys, offsets, sizes = [], [], []
        for data, meta in zip(members[::2], members[1::2]):
            key, ext = _split(data.name)
            if _split(meta.name)[0] != key or _split(meta.name)[1] not in ("json", "nometa"):
                raise ShardError(f"Shar shard {url} at byte {meta.offset}: member {meta.name!r} does not hold the "
                                 f"manifest of {data.name!r}")
            keys.append(key)
            offsets.append(data.offset)
            sizes.append(meta.end - data.offset)
        check_counts(url, len(keys), int(catalog.counts[shard]), f"cuts file {cuts_url}")
        ids = [str(c.get("id")) for c in cuts]
        if ids != keys:
            j = next(i for i, (a, b) in enumerate(zip(ids, keys)) if a != b)
            raise ShardError(f"Shar shard {url}: member {j} belongs to cut {keys[j]!r} but the cuts file lists "
                             f"{ids[j]!r} there; the tar and {cuts_url} are not one shard")
        if digest(np.array(ids, dtype=object).astype(str), catalog.lengths(shard)) != catalog.digests[shard]:
            raise ShardError(f"Shar cuts file {cuts_url} changed since this job opened it; restart the job")
        info = [json_bytes(c) for c in cuts]
        return SampleTable(np.array([k.encode("utf-8", "surrogateescape") for k in keys], dtype=bytes),
                           np.asarray(offsets, np.int64), np.asarray(sizes, np.int64), self, info)

    def sample(self, url: str, offset: int, key: str, data: bytes, info: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"__key__": key, "__url__": url}
        for name, value in tar_members(data, url, offset, key):
            member_key, ext = _split(name)
            if member_key != key:
                raise ShardError(f"Shar shard {url} at byte {offset}: found member {name!r} where cut {key!r} "
                                 "was planned; the shard changed since this job scanned it")
            if ext in _NO_DATA:
                continue
            out[f"{self.field}.{ext}"] = value
        out["cut.json"] = info
        return out


def _split(name: str) -> tuple[str, str]:
    """(cut id, extension) of a Shar member name: the id may hold dots, the extension does not."""
    base = os.path.basename(name)
    key, _, ext = base.rpartition(".")
    return key, ext.lower()


def claims(given: Any) -> bool:
    """A local directory holding Shar cuts files, or a cuts file itself."""
    if not isinstance(given, (str, os.PathLike)):
        return False
    text = os.fspath(given)
    if is_local(text) and os.path.isdir(local_path(text)):
        return any(_SHARD.match(n) and n.startswith("cuts.") for n in os.listdir(local_path(text)))
    return False


FORMAT = CorpusFormat("shar", Shar, claims, "Lhotse Shar: cuts.NNNNNN.jsonl.gz + recording.NNNNNN.tar per shard",
                      build=lambda given: Shar(in_dir=os.fspath(given)))
