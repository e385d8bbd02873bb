"""``streambatch plan --mix``: a weighted mix planned as DynamicBatchSampler.mixed plans it, with each
source's realised share reported (in process: the same code path as the console script)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streambatch import DynamicBatchSampler
from streambatch.cli.main import main
from tests.support.helpers import lognormal_lengths


def test_plan_mix_reports_realised_shares(tmp_path, capsys):
    a, b = lognormal_lengths(3000, seed=1), lognormal_lengths(800, seed=2) * 3
    np.save(tmp_path / "a.npy", a)
    (tmp_path / "b.txt").write_text("\n".join(map(str, b)))
    args = ["plan", "--mix", f"{tmp_path}/a.npy:0.6", f"{tmp_path}/b.txt:0.4", "-t", "16000", "-b", "32", "-w", "4",
            "--planner", "bucketed", "--epoch", "1"]
    assert main(args + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    s = DynamicBatchSampler.mixed([a, b], 16000, 32, weights=[0.6, 0.4], world_size=4, planner="bucketed")
    s.set_epoch(1)
    assert got["steps"] == len(s) and got["samples"] == got["samples_per_epoch"] == 3800
    names = [x["name"] for x in got["sources"]]
    assert names == ["a.npy", "b.txt"]
    assert [x["quota"] for x in got["sources"]] == [2280, 1520]
    for x, want in zip(got["sources"], (0.6, 0.4)):
        assert x["share"] == pytest.approx(want, abs=1 / 3800 * 4) and x["target_share"] == pytest.approx(want)
    assert got["sources"][1]["cycle"] == 1  # b (800) is up-sampled: epoch 1 starts in its second cycle
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "a mix of 2 sources" in text and "realised" in text and "first 10%" in text and "b.txt" in text


@pytest.mark.parametrize("args, message", [
    (["--mix", "a.npy:zz"], "INPUT:WEIGHT or INPUT:xREPEAT"),
    (["--mix", "a.npy:x2", "b.npy:0.5"], "not both"),
    ([], "give one or more INPUTs, or --mix"),
    (["x.npy", "--mix", "a.npy:1"], "not both"),
    (["x.npy", "--samples-per-epoch", "5"], "--samples-per-epoch applies to --mix"),
])
def test_plan_mix_mistakes_are_one_line(args, message, capsys):
    assert main(["plan", "-t", "100", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
