"""NeMo tarred audio: ``audio_N.tar`` shards of audio files plus JSON-lines
manifests whose entries name a member (``audio_filepath``), its ``duration``
in seconds, the ``text`` and the ``shard_id`` of its tar, as NeMo's
``convert_to_tarred_audio_dataset.py`` writes them: one
``tarred_audio_manifest.json`` for every shard, and/or one
``sharded_manifests/manifest_N.json`` per shard. NeMo's ``_OP_``/``_CL_``
spelling of braces (``manifest__OP_0..63_CL_.json``) is accepted.

Lengths come from the manifests alone (``length_from="json:duration"`` with
``frames_per_second``; any field of an entry); no tar is opened to plan. A
rank reads its entries' members by offset (the tar's member headers scanned
when a pass first needs the shard). An entry may name ``X-subN.wav``: NeMo's
converter writes a file used by several entries once, as ``X.wav``, and the
entry reads that member. An entry with ``offset`` refers to a slice of its
file: the sample holds the whole file and the entry, whose ``offset`` and
``duration`` say which part to use.

A sample is ``{"__key__": the member's name without its extension,
"__url__": tar URL, "<ext>": audio bytes, "json": the manifest entry}``.

Stream: a NeMo tarred corpus as a ``Catalog`` (manifest lengths) and its samples' tar bytes -> sample dicts."""

from __future__ import annotations

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
    digest,
    json_bytes,
    json_lines,
    lengths_of,
    narrow,
    read_object,
    scan_members,
    tar_members,
)

MANIFEST = "tarred_audio_manifest.json"
_SUB = re.compile(r"-sub\d+(?=\.[^.]*$)")
_NUMBER = re.compile(r"(\d+)(?=\.[^./]*$)")
_SHARDED = re.compile(r"manifest_\d+\.jsonl?$")


def nemo_braces(pattern: Any) -> Any:
    """NeMo's ``_OP_``/``_CL_`` brace spelling as braces (a list: each item)."""
    if isinstance(pattern, (list, tuple)):
        return [nemo_braces(p) for p in pattern]
    if isinstance(pattern, os.PathLike):
        pattern = os.fspath(pattern)
    return pattern.replace("_OP_", "{").replace("_CL_", "}") if isinstance(pattern, str) else pattern


def _parent(url: str) -> str:
    return url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[0] if "/" in url else "."


@dataclass(frozen=True)
class NemoTarred:
    """A NeMo tarred audio corpus.

    manifests: ``tarred_audio_manifest.json`` (every shard), or the sharded
        manifests (``sharded_manifests/manifest_{0..63}.json``, NeMo's
        ``manifest__OP_0..63_CL_.json`` too), local or remote;
    tars: the audio tars (``audio_{0..63}.tar``); default: ``audio_<shard_id>.tar``
        in the manifest's directory (for sharded manifests: its parent).
        A tar is found by the number in its name (``shard_id``), else by position.
    """

    manifests: Any
    tars: Any = None

    def _manifests(self) -> list[str]:
        return expand_urls(nemo_braces(self.manifests))

    def _entries(self, settings: OpenSettings) -> tuple[list[str], list[list[dict]]]:
        urls = self._manifests()
        workers = 16 if any(is_remote(u) for u in urls) else 1
        with ThreadPoolExecutor(workers) as pool:
            entries = list(pool.map(lambda u: read_manifest(u, settings.storage_options, settings.retry), urls))
        return urls, entries

    def _tars(self) -> dict[int, str] | None:
        if self.tars is None:
            return None
        tars = expand_urls(nemo_braces(self.tars))
        numbered = {}
        for i, t in enumerate(tars):
            m = _NUMBER.search(t.split("?", 1)[0])
            numbered[int(m.group(1)) if m else i] = t
        return numbered if len(numbered) == len(tars) else dict(enumerate(tars))

    def shards(self, settings: OpenSettings) -> tuple[list[int], list[str], list[str], list[list[dict]]]:
        """(shard ids, tar URLs, manifest per shard ('' : the shared one), entries per shard), by shard id."""
        urls, per_file = self._entries(settings)
        sharded = len(urls) > 1 or _SHARDED.search(urls[0].split("?", 1)[0]) is not None
        groups: dict[int, list[dict]] = {}
        source: dict[int, str] = {}
        for u, entries in zip(urls, per_file):
            m = _NUMBER.search(u.split("?", 1)[0])
            for j, e in enumerate(entries):
                sid = e.get("shard_id", int(m.group(1)) if (sharded and m) else None)
                if isinstance(sid, bool) or not isinstance(sid, int) or sid < 0:
                    raise ValueError(f"NeMo manifest {scrub_url(u)}, entry {j}: shard_id {sid!r} is not a shard "
                                     "number; tarred manifests give each entry the shard_id of its tar")
                if "audio_filepath" not in e:
                    raise ValueError(f"NeMo manifest {scrub_url(u)}, entry {j}: no audio_filepath")
                groups.setdefault(sid, []).append(e)
                if source.setdefault(sid, u) != u:
                    source[sid] = ""  # one shard's entries in several manifests: read them all
        explicit = self._tars()
        ids = sorted(groups)
        tars = []
        for sid in ids:
            if explicit is not None:
                if sid not in explicit:
                    raise ValueError(f"NeMo manifest entries have shard_id {sid} but no tar of the {len(explicit)} "
                                     "given has that number")
                tars.append(explicit[sid])
            else:
                base = _parent(urls[0])
                base = _parent(base) if sharded and base.rstrip("/").endswith("sharded_manifests") else base
                tars.append(f"{base}/audio_{sid}.tar" if not is_local(base) else os.path.join(base, f"audio_{sid}.tar"))
        manifests = [source[sid] if sharded else "" for sid in ids]
        return ids, tars, manifests, [groups[sid] for sid in ids]

    def shard_urls(self, settings: OpenSettings) -> list[str]:
        return self.shards(settings)[1]

    def open(self, settings: OpenSettings) -> Catalog:
        """The catalog: every entry's length from the manifests; no tar is opened."""
        ids, tars, manifests, groups = self.shards(settings)
        spec = settings.spec("json:duration")
        lengths, digests = [], []
        for sid, entries in zip(ids, groups):
            where = lambda j, sid=sid: f"NeMo shard {sid}, manifest entry {j}"  # noqa: E731
            lens = lengths_of(entries, spec, where)
            lengths.append(lens)
            digests.append(digest(np.array([e["audio_filepath"] for e in entries], dtype=str), lens))
        counts = np.array([len(g) for g in groups], dtype=np.int64)
        layout = NemoLayout(tuple(self._manifests()), dict(zip(tars, ids)), settings.storage_options,
                            settings.retry)
        all_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        return Catalog(tuple(tars), tuple(manifests), counts, tuple(digests), narrow(all_lengths),
                       np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                       storage_options=settings.storage_options, layouts=(layout,) * len(tars))


def read_manifest(url: str, storage_options: dict | None = None, retry=None) -> list[dict]:
    """The entries of one NeMo manifest (JSON lines), in order."""
    return list(json_lines(read_object(url, storage_options, retry, "NeMo manifest"),
                           f"NeMo manifest {scrub_url(url)}"))


def member_name(entry: dict) -> str:
    """The tar member an entry reads: its ``audio_filepath``'s file name, without NeMo's ``-subN`` marker."""
    return _SUB.sub("", os.path.basename(str(entry["audio_filepath"])))


class NemoLayout(Layout):
    """Reads the samples of NeMo audio tars, with their manifest entries."""

    name = "nemo"

    def __init__(self, manifests: tuple[str, ...], shard_ids: dict[str, int], storage_options: dict | None, retry):
        self.manifests, self.shard_ids = manifests, shard_ids
        self.storage_options, self.retry = storage_options, retry
        self._groups: dict[int, list[dict]] | None = None  # the shared manifest, read once per process

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_groups": None}  # a worker reads what it needs itself

    def _entries(self, shard_id: int, manifest: str, copy: str | None) -> list[dict]:
        if manifest:  # this shard's own manifest (a sharded one)
            return [e for e in read_manifest(copy or manifest, self.storage_options, self.retry)
                    if e.get("shard_id", shard_id) == shard_id]
        if self._groups is None:
            groups: dict[int, list[dict]] = {}
            for u in self.manifests:
                for e in read_manifest(u, self.storage_options, self.retry):
                    groups.setdefault(e.get("shard_id", -1), []).append(e)
            self._groups = groups
        return self._groups.get(shard_id, [])

    def table(self, catalog: Catalog, shard: int, copy: str | None = None) -> SampleTable:
        url = catalog.urls[shard]
        sid = self.shard_ids[url]
        try:
            entries = self._entries(sid, catalog.sidecars[shard], copy)
            members = {e.name.rsplit("/", 1)[-1]: e for e in scan_members(url, self.storage_options, self.retry)}
        except (OSError, ValueError) as exc:
            if isinstance(exc, ShardError):
                raise
            raise ShardError(f"cannot read NeMo shard {url}: {exc}") from exc
        names = [str(e["audio_filepath"]) for e in entries]
        if digest(np.array(names, dtype=str), catalog.lengths(shard)) != catalog.digests[shard]:
            raise ShardError(f"the NeMo manifest entries of shard {url} changed since this job opened them; "
                             "restart the job")
        offsets, sizes = [], []
        for e in entries:
            m = members.get(member_name(e))
            if m is None:
                raise ShardError(f"NeMo shard {url} has no member {member_name(e)!r} (manifest entry "
                                 f"{e['audio_filepath']!r}); the tar and the manifest do not belong together")
            offsets.append(m.offset)
            sizes.append(m.end - m.offset)
        keys = np.array([os.path.splitext(os.path.basename(n))[0].encode("utf-8", "surrogateescape") for n in names],
                        dtype=bytes) if names else np.zeros(0, "S1")
        return SampleTable(keys, np.asarray(offsets, np.int64), np.asarray(sizes, np.int64), self,
                           [json_bytes(e) for e in entries])

    def sample(self, url: str, offset: int, key: str, data: bytes, info: Any) -> dict[str, Any]:
        members = tar_members(data, url, offset, key)
        if len(members) != 1:
            raise ShardError(f"NeMo shard {url} at byte {offset}: expected one audio member for {key!r}, found "
                             f"{len(members)}; the shard changed since this job scanned it")
        name, audio = members[0]
        return {"__key__": key, "__url__": url, name.rsplit(".", 1)[-1].lower(): audio, "json": info}


def claims(given: Any) -> bool:
    """A NeMo manifest (``.json``, NeMo braces too), or a local directory holding ``tarred_audio_manifest.json``."""
    if isinstance(given, (list, tuple)):
        return bool(given) and all(claims(g) for g in given)
    if not isinstance(given, (str, os.PathLike)):
        return False
    text = os.fspath(given)
    if text.split("?", 1)[0].endswith((".json", ".jsonl")) or "_OP_" in text:
        return True
    return is_local(text) and os.path.isfile(os.path.join(local_path(text), MANIFEST))


def build(given: Any) -> NemoTarred:
    text = os.fspath(given) if isinstance(given, os.PathLike) else given
    if isinstance(text, str) and is_local(text) and os.path.isdir(local_path(text)):
        return NemoTarred(os.path.join(local_path(text), MANIFEST))
    return NemoTarred(text)


FORMAT = CorpusFormat("nemo", NemoTarred, claims, "NeMo tarred audio: audio_N.tar + JSON-lines manifests",
                      build=build)
