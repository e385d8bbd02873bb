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
