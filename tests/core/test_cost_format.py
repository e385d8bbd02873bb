"""A cost model file of a format version this streambatch does not know is refused, naming the version and
the fix (issue 32, item 20), instead of loading silently with whatever fields it happens to share."""

from __future__ import annotations

import json

import pytest

from streambatch.core.cost import COST_FORMAT, CostModel


def test_a_saved_model_round_trips(tmp_path):
    path = tmp_path / "cost.json"
    CostModel.step(0.05, 2e-7, 1e-10).save(path)
    assert CostModel.load(path) == CostModel.step(0.05, 2e-7, 1e-10)


@pytest.mark.parametrize("version", [2, 99, "1", None, 1.5])
def test_an_unknown_version_is_refused(tmp_path, version):
    path = tmp_path / "cost.json"
    d = CostModel.step(0.05, 2e-7, 1e-10).to_dict()
    if version is None:
        del d["version"]
    else:
        d["version"] = version
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"version .*streambatch calibrate") as info:
        CostModel.load(path)
    assert str(path) in str(info.value) and COST_FORMAT in str(info.value)
