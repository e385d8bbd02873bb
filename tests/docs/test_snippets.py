"""Every Python block of the docs and the README runs as written, or is a faithful excerpt of an example.

A markdown page's fenced blocks are read in order. A ```python block is one of:

- an excerpt: its first line is ``# excerpt of examples/NAME.py``; every other line (but blank
  lines and ``...``) must appear in that file, in the same order (fast tier; the example itself
  runs in tests/examples/);
- a file: its first line is ``# file: NAME``; it is written to the page's scratch directory for
  the commands after it to use;
- code: run, in one namespace per page, in a scratch directory (slow tier). Blocks build on the
  ones before them, as a reader pasting them in order would.

A ```bash block preceded by the line ``<!-- run -->`` is run too, line by line, in the same
directory (``pip install`` lines are not run). Every other bash block is left alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.support.helpers import TESTS

ROOT = os.path.dirname(TESTS)
EXCERPT = re.compile(r"^# excerpt of (examples/[\w./-]+\.py)\s*$")
FILE = re.compile(r"^# file: ([\w./-]+)\s*$")
FENCE = re.compile(r"^( *)```(\w*)\s*$")


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    run: bool  # a bash block marked <!-- run -->

    @property
    def where(self) -> str:
        return f"{os.path.relpath(self.page, ROOT)}:{self.line}"

    @property
    def kind(self) -> str:
        first = self.code.split("\n", 1)[0]
        if EXCERPT.match(first):
            return "excerpt"
        if FILE.match(first):
            return "file"
        return "code"


def pages() -> list[str]:
    found = [os.path.join(ROOT, "README.md")]
    for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
        found += [os.path.join(folder, n) for n in names if n.endswith(".md")]
    return sorted(found)


def blocks(page: str) -> list[Block]:
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        start = i
        body = []
        i += 1
        while i < len(lines) and not re.match(rf"^ {{0,{indent}}}```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        marked = start > 0 and lines[start - 1].strip() == "<!-- run -->"
        out.append(Block(page, start + 1, lang, "\n".join(body) + "\n", marked))
        i += 1
    return out


def python_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p) if b.lang == "python"]


def runnable_pages() -> list[str]:
    return [p for p in pages() if any((b.lang == "python" and b.kind == "code") or (b.lang == "bash" and b.run)
                                      for b in blocks(p))]


# ---------------------------------------------------------------- fast: excerpts and syntax


def test_pages_have_python_blocks():
    found = python_blocks()
    assert len(found) >= 20
    assert {b.kind for b in found} == {"excerpt", "code", "file"}


@pytest.mark.parametrize("block", [b for b in python_blocks() if b.kind == "excerpt"], ids=lambda b: b.where)
def test_excerpt_matches_its_example(block):
    name = EXCERPT.match(block.code.split("\n", 1)[0]).group(1)
    path = os.path.join(ROOT, name)
    assert os.path.isfile(path), f"{block.where}: no {name}"
    with open(path, encoding="utf-8") as f:
        source = [line.strip() for line in f.read().split("\n")]
    pos = 0
    for line in block.code.split("\n")[1:]:
        text = line.strip()
        if not text or text == "...":
            continue
        try:
            pos = source.index(text, pos) + 1
        except ValueError:
            pytest.fail(f"{block.where}: {text!r} is not in {name} (after line {pos}); keep the excerpt a copy")


@pytest.mark.parametrize("block", [b for b in python_blocks() if b.kind != "excerpt"], ids=lambda b: b.where)
def test_code_compiles(block):
    compile(block.code, block.where, "exec")


# ---------------------------------------------------------------- slow: run every page


def run_bash(block: Block, cwd: str) -> None:
    command = re.sub(r"\\\n", " ", block.code)
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for line in command.split("\n"):
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#") or line.startswith("pip "):
            continue
        # the repository's scripts, examples and tests, as from a clone's root
        line = re.sub(r"(?<=\s)(scripts|examples|tests)/", rf"{ROOT}/\1/", line)
        done = subprocess.run(line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{block.where}: `{line}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_page_runs_as_written(page, tmp_path, monkeypatch):
    from streambatch.planners import PLANNERS
    from streambatch.streaming import FORMATS

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(tmp_path))  # modules a page writes (# file: ...) import as from its directory
    registered, formats = dict(PLANNERS), dict(FORMATS)
    modules = set(sys.modules)
    try:
        run_page(page, tmp_path)
    finally:  # planners, corpus formats and modules a page registered stay with the page
        PLANNERS.clear()
        PLANNERS.update(registered)
        FORMATS.clear()
        FORMATS.update(formats)
        for name in set(sys.modules) - modules:
            if getattr(sys.modules[name], "__file__", "") and str(tmp_path) in sys.modules[name].__file__:
                del sys.modules[name]


def run_page(page: str, tmp_path) -> None:
    namespace: dict = {"__name__": "__main__"}
    for block in blocks(page):
        if block.lang == "bash" and block.run:
            run_bash(block, str(tmp_path))
        elif block.lang == "python" and block.kind == "file":
            name = FILE.match(block.code.split("\n", 1)[0]).group(1)
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(block.code)
        elif block.lang == "python" and block.kind == "code":
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(block.code, block.where, "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"{block.where} failed: {exc!r}\n{out.getvalue()[-2000:]}") from exc
