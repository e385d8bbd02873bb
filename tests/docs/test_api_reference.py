"""The API reference documents every public name: each of ``streambatch.__all__`` and
``streambatch.streaming.__all__`` has a ``::: path`` directive in docs/api/ that resolves
to that very object (mkdocs build --strict then renders it, or fails)."""

from __future__ import annotations

import glob
import importlib
import os
import re

import pytest

import streambatch
import streambatch.streaming
from tests.support.helpers import TESTS

API = os.path.join(os.path.dirname(TESTS), "docs", "api")


def paths() -> list[str]:
    """The ``::: path`` directives of the API pages."""
    found = []
    for page in glob.glob(os.path.join(API, "*.md")):
        with open(page, encoding="utf-8") as f:
            found += re.findall(r"^::: ([\w.]+)\s*$", f.read(), flags=re.M)
    return found


def directives() -> dict[str, object]:
    """path -> the object each ``::: path`` line of the API pages names."""
    return {path: resolve(path) for path in paths()}


def resolve(path: str) -> object:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


@pytest.mark.parametrize("module", [streambatch, streambatch.streaming], ids=lambda m: m.__name__)
def test_every_public_name_has_a_directive(module):
    # by name only: reading __all__ imports none of the lazily loaded glue (torch, accelerate)
    named = {p.rsplit(".", 1)[-1] for p in paths()}
    assert not [n for n in module.__all__ if n not in named]


@pytest.mark.slow  # resolving every name imports the glue (torch, accelerate): a few seconds
@pytest.mark.parametrize("module", [streambatch, streambatch.streaming], ids=lambda m: m.__name__)
def test_every_public_name_is_documented(module):
    documented = directives()
    objects = [id(o) for o in documented.values()]
    missing = [name for name in module.__all__ if id(getattr(module, name)) not in objects]
    assert not missing, f"{module.__name__}.__all__ names without a ::: directive in docs/api/: {missing}"


@pytest.mark.slow
def test_every_directive_resolves():
    assert len(directives()) >= 30
