"""StreamingBatches' settings beyond planning (``streaming/options.py``): ``verify`` parsed once into the three
checks it switches."""

from __future__ import annotations

import pytest

from streambatch.streaming.options import Checks, Options


def test_verify_is_three_named_checks():
    assert Checks.parse(True) == Checks(ranks=True, shards="stat", remote=True)
    assert Checks.parse(False) == Checks(ranks=False, shards="stat", remote=False)
    assert Checks.parse("full") == Checks(ranks=True, shards="full", remote=True)
    for bad in ("yes", "stat", 2):
        with pytest.raises(TypeError, match="verify"):
            Checks.parse(bad)
    o = Options.build(verify="full")
    assert o.checks.shards == o.index.verify == "full" and o.checks.ranks


def test_setting_objects_are_the_flat_keywords_grouped():
    from streambatch.streaming import IndexSettings, OutputSettings, RemoteSettings
    from streambatch.streaming.options import ungroup

    flat = dict(index_dir=None, index_missing=False, length_from=None, frames_per_second=None, index_workers=1,
                storage_options=None, cache_dir=None, prefetch_shards=4, prefetch_bytes=None, retry=None,
                trust_catalog=False, decode=None, collate_fn=None, on_error="raise")
    # every flat keyword has its field, with the keyword's default
    assert sorted(flat) == sorted(f for kind in (IndexSettings, RemoteSettings, OutputSettings)
                                  for f in kind.__dataclass_fields__)
    got = ungroup({"index": IndexSettings(frames_per_second=50), "remote": RemoteSettings(cache_dir="/c"),
                   "output": None}, dict(flat, on_error="skip"))
    assert got == dict(flat, frames_per_second=50, cache_dir="/c", on_error="skip")
    with pytest.raises(ValueError, match="cache_dir was given both"):
        ungroup({"index": None, "remote": RemoteSettings(cache_dir="/c"), "output": None}, dict(flat, cache_dir="/d"))
    with pytest.raises(TypeError, match="RemoteSettings"):
        ungroup({"index": None, "remote": {"cache_dir": "/c"}, "output": None}, flat)
    assert "secret" not in repr(RemoteSettings(storage_options={"key": "secret"}))  # credentials stay out of logs


def test_the_dataset_takes_grouped_settings(make_corpus):
    from streambatch.streaming import IndexSettings, OutputSettings, StreamingBatches

    c = make_corpus([12, 9, 15], seed=3)
    flat = StreamingBatches(c.brace, 400, 8, world_size=1, rank=0, on_error="skip", index_workers=1)
    grouped = StreamingBatches(c.brace, 400, 8, world_size=1, rank=0, output=OutputSettings(on_error="skip"),
                               index=IndexSettings(index_workers=1))
    assert grouped.options == flat.options and grouped.fingerprint == flat.fingerprint
    assert [[s["__key__"] for s in b] for b in grouped] == [[s["__key__"] for s in b] for b in flat]
