"""The ``streambatch`` command line, driven as a user drives it.

Each subprocess imports torch (a few seconds on 2 cores), so the subprocess
runs are few and each checks a whole user story; variations of argument
errors call ``main()`` in this process, which is the same code path.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from streambatch import make_plan
from streambatch.cli.main import build_parser, main
from streambatch.cli.plan import is_shards
from streambatch.cli.report import plan_batches, quality


def sb(*args, script: bool = False, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``python -m streambatch.cli ARGS``, or the installed console script."""
    cmd = [sys.executable, "-m", "streambatch.cli"]
    if script:
        exe = Path(sys.executable).with_name("streambatch")
        if not exe.exists():
            pytest.skip("console script not installed (pip install -e .)")
        cmd = [str(exe)]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(returncode: int, stderr: str, *fragments: str) -> None:
    assert returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("streambatch: error: "), stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture(scope="module")
def lengths() -> np.ndarray:
    return np.random.default_rng(0).integers(25, 1500, 3000)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from streambatch.cli.corpus import make_shards

    d = tmp_path_factory.mktemp("shards")
    make_shards(str(d), 3, 5, seed=1, speech="generated", sample_rate=8000)
    return d


# ---------------------------------------------------------------- as a user (subprocess)


@pytest.mark.slow
def test_plan_npy_prints_report_and_writes_figure(tmp_path, lengths):
    pytest.importorskip("matplotlib")
    np.save(tmp_path / "lengths.npy", lengths)
    r = sb("plan", tmp_path / "lengths.npy", "--max-batch-tokens", "16_000", "--world-size", "4",
           "--plot", tmp_path / "plan.png")
    assert r.returncode == 0, r.stderr
    for text in ("3,000 samples from lengths.npy", "steps per rank", "padding efficiency", "balance efficiency",
                 "budget use", "batch size (samples per batch", "sample length", "█"):
        assert text in r.stdout
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_plan_manifest_json_matches_the_library(tmp_path, lengths):
    with gzip.open(tmp_path / "cuts.jsonl.gz", "wt") as f:
        for i, x in enumerate(lengths):
            f.write(json.dumps({"id": f"cut{i}", "start": 0, "duration": x / 50, "type": "MonoCut"}) + "\n")
    r = sb("plan", tmp_path / "cuts.jsonl.gz", "--frames-per-second", "50", "-t", "16000", "-b", "32", "-w", "8",
           "--seed", "7", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    q = quality(plan_batches(make_plan(lengths, 16000, 32, 8, seed=7), lengths), 16000)
    assert got["samples"] == lengths.size
    for k, v in q.as_dict().items():
        assert got[k] == pytest.approx(v), k


@pytest.mark.slow
def test_plan_bad_argument_and_unreadable_input(tmp_path):
    r = sb("plan", tmp_path / "x.npy", "--max-batch-tokens", "0")
    assert_one_line_error(r.returncode, r.stderr, "--max-batch-tokens", "whole number >= 1", "streambatch plan --help")
    (tmp_path / "garbage.bin").write_bytes(bytes(range(256)) * 4)
    r = sb("plan", tmp_path / "garbage.bin", tmp_path / "missing.npy", "-t", "100")
    assert_one_line_error(r.returncode, r.stderr, "garbage.bin is neither a .npy array nor UTF-8 text")
    assert r.stdout == ""


@pytest.mark.slow
def test_index_then_plan_shards(shards, tmp_path, capsys):
    shards = Path(shutil.copytree(shards, tmp_path / "shards", ignore=shutil.ignore_patterns("*.idx.npz")))
    code = main(["plan", str(shards), "-t", "2000"])  # in process: the same path a user takes, without torch's import
    # the hint names the flag these shards need (their json durations are seconds); tests/cli/test_hints.py runs it
    assert_one_line_error(code, capsys.readouterr().err, "no usable sidecar index",
                          f"run `streambatch index --frames-per-second 50 '{shards}'` first")
    r = sb("index", f"{shards}/demo-{{000000..000002}}.tar", "--frames-per-second", "50", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "3 shards: 3 indexed, 0 already current" in r.stdout
    assert "samples          15" in r.stdout and "p50" in r.stdout and " frames = " in r.stdout
    assert len(list(shards.glob("*.idx.npz"))) == 3
    r = sb("plan", shards, "-t", "2000", "-w", "2", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["samples"] == 15 and got["source"] == "3 indexed shards (50 frames/s)"


@pytest.mark.slow
def test_bench_small_grid_with_seed_comparison_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    r = sb("bench", "--sizes", "2e3", "5000", "--worlds", "2", "4", "--seed-n", "300", "--seed-worlds", "2",
           "--planners", "greedy", "--plot", tmp_path / "bench.png", script=True)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| greedy |")]
    assert len(rows) == 4  # every (N, W) cell
    assert "pure-Python seed algorithm (N=300" in r.stdout and "| 2 | greedy |" in r.stdout
    assert "[6/6]" in r.stderr  # plain progress lines when stderr is not a terminal
    assert (tmp_path / "bench.png").exists()
    r = sb("bench", "--sizes", "0")
    assert_one_line_error(r.returncode, r.stderr, "--sizes")


@pytest.mark.slow
def test_demo_on_a_tiny_corpus(tmp_path):
    r = sb("demo", "--dir", tmp_path / "corpus", "--shards", "4", "--samples-per-shard", "6")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for text in ("[1/3] wrote 4 WebDataset shards", "[2/3] indexed", "every rank took the same number of steps",
                 "24 of 24 utterances delivered", "padding efficiency", "balance efficiency", "samples/s",
                 "<- streamed above", "next:"):
        assert text in out
    assert "DIFFERS" not in out  # what was streamed is what the sidecars plan
    assert len(list((tmp_path / "corpus").glob("demo-*.tar"))) == 4


# ---------------------------------------------------------------- same code path, in process


@pytest.mark.parametrize("argv, fragments", [
    ([], ["the following arguments are required: COMMAND"]),
    (["plot"], ["invalid choice: 'plot'"]),
    (["plan", "x.npy"], ["--max-batch-tokens"]),
    (["plan", "x.npy", "-t", "1.5"], ["whole number"]),
    (["plan", "x.npy", "-t", "100", "--planner", "nope"], ["invalid choice: 'nope'", "greedy"]),
    (["plan", "x.npy", "-t", "100", "-o", "width"], ["KEY=VALUE"]),
    (["plan", "x.npy", "-t", "100", "--fps", "-50"], ["number > 0"]),
    (["bench", "--worlds", "0"], ["--worlds"]),
    (["index"], ["SHARD"]),
    (["demo", "--workers", "-1"], ["--workers"]),
])
def test_usage_mistakes_are_one_line(capsys, argv, fragments):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert_one_line_error(exc.value.code, capsys.readouterr().err, *fragments)


def test_runtime_mistakes_are_one_line(tmp_path, capsys, lengths):
    np.save(tmp_path / "l.npy", lengths)
    (tmp_path / "empty_dir").mkdir()
    cases = [
        (["plan", str(tmp_path / "nope.npy"), "-t", "100"], ["nope.npy: No such file"]),
        (["plan", str(tmp_path / "l.npy"), "-t", "100", "-o", "bucket_width=0.1"], ["bucket_width"]),
        (["plan", str(tmp_path / "empty_dir"), "-t", "100"], ["is a directory"]),
        (["plan", str(tmp_path / "l.npy"), "-t", "100", "--plot", str(tmp_path / "no" / "p.png")],
         ["p.png: no such directory to write the figure in"]),
        (["plan", str(tmp_path / "l.npy"), "-t", "100", "--field", "duration"], ["--field only applies to JSON"]),
        (["index", str(tmp_path / "empty_dir")], ["without .tar shards"]),
        (["index", str(tmp_path / "missing-{000..001}.tar"), "--workers", "1"], ["missing-000.tar"]),
    ]
    if shutil.which("espeak-ng") is None:
        cases.append((["demo", "--speech", "espeak", "--dir", str(tmp_path / "c")], ["espeak-ng"]))
    for argv, fragments in cases:
        code = main(argv)
        assert_one_line_error(code, capsys.readouterr().err, *fragments)


def test_plan_on_shards_translates_api_words_into_flags(shards, capsys):
    # Sidecars written with json:duration*50/s; asking for --fps 100 must name the re-index command.
    from streambatch.streaming import index_shards

    index_shards(str(shards / "demo-{000000..000002}.tar"), frames_per_second=50, workers=1, progress=False)
    code = main(["plan", str(shards), "-t", "2000", "--fps", "100"])
    assert_one_line_error(code, capsys.readouterr().err, "streambatch index --force",
                          "--frames-per-second 100")


def test_every_subcommand_has_help_with_examples():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == {"demo", "plan", "bench", "index", "calibrate", "preflight", "warmup"}
    for name, p in sub.choices.items():
        text = p.format_help()
        assert text.startswith(f"usage: streambatch {name}")
        assert "(default:" in text
    assert "cuts.jsonl.gz" in sub.choices["plan"].format_help()
    assert "--sizes 1e6 1e7 4e7 --worlds 8 64 512" in sub.choices["bench"].format_help()
    assert "--script bench/model.py:make_step" in sub.choices["calibrate"].format_help()


def test_argument_types():
    parser = build_parser()
    a = parser.parse_args(["bench", "--sizes", "1e6", "40_000_000", "--worlds", "512"])
    assert a.sizes == [1_000_000, 40_000_000] and a.worlds == [512]
    a = parser.parse_args(["plan", "x", "-t", "1.6e4", "-o", "bucket_width=0.05", "-o", "cost=linear"])
    assert a.max_batch_tokens == 16_000 and a.planner_option == [("bucket_width", 0.05), ("cost", "linear")]


def test_shard_inputs_are_recognised(tmp_path, shards):
    assert is_shards("train-{000000..000099}.tar") and is_shards("pipe:curl -s x.tar") and is_shards("s3://b/a.tar")
    assert is_shards(str(shards)) and not is_shards(str(tmp_path)) and not is_shards("cuts.jsonl.gz")


def test_bench_helpers_in_process(capsys):
    from streambatch.cli.bench import SweepProgress, sweep
    from streambatch.cli.timing import peak_growth

    rows = sweep([1500, 500], [3], ["greedy"], 1)
    assert [(r["n"], r["world_size"]) for r in rows] == [(500, 3), (1500, 3)]
    assert all(r["seconds"] > 0 and r["samples_per_s"] > 0 for r in rows)
    grown = peak_growth(lambda: np.ones(2**24))  # 128 MiB
    assert grown is None or grown >= 100 * 2**20
    p = SweepProgress(2)
    p.step("one")
    p.step("two")
    p.close()
    assert "[2/2] two" in capsys.readouterr().err


def test_output_paths_are_checked_before_any_work(tmp_path, capsys, lengths):
    pytest.importorskip("matplotlib")
    np.save(tmp_path / "l.npy", lengths)
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "keep.txt").write_text("mine")
    for target, fragment in [(figs, "is a directory: name the figure file"),
                             (figs / "plan", "cannot tell the figure format"),
                             (figs / "plan.xyz", "cannot tell the figure format")]:
        code = main(["plan", str(tmp_path / "l.npy"), "-t", "2000", "--plot", str(target)])
        out, err = capsys.readouterr()
        assert_one_line_error(code, err, fragment)
        assert out == ""  # refused up front, not after the report
    # the demo refuses to write over a non-empty directory unless --force
    code = main(["demo", "--dir", str(figs), "--shards", "1", "--samples-per-shard", "2"])
    out, err = capsys.readouterr()
    assert_one_line_error(code, err, "--dir is not empty", "--force")
    assert "[1/3]" not in out and sorted(p.name for p in figs.iterdir()) == ["keep.txt"]
    assert not list(tmp_path.glob("*.png"))  # nothing written beside the directory either
