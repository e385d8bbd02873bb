"""The built documentation site as a reader sees it (bench/docs_site.py): every nav page built and linked,
the search index holding every page and public name, the API reference an entry per public name, and the
front page and the API reference rendered by headless Chromium (skipped without it)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from tests.support.helpers import TESTS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="needs the docs extra")]


def docs_site():
    path = os.path.join(os.path.dirname(TESTS), "bench", "docs_site.py")
    spec = importlib.util.spec_from_file_location("docs_site", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tool = docs_site()
    site = str(tmp_path_factory.mktemp("site") / "html")
    tool.build(site)
    return tool, site


def test_nav_search_index_and_api_pages(built):
    tool, site = built
    assert len(tool.nav_pages()) >= 20
    assert tool.check_site(site) == []


def test_what_is_missing_is_named(built, tmp_path):
    tool, site = built
    no_entry = str(tmp_path / "no-entry")
    shutil.copytree(site, no_entry)
    page = os.path.join(no_entry, "api", "streaming", "index.html")
    with open(page, encoding="utf-8") as f:
        html = f.read()
    with open(page, "w", encoding="utf-8") as f:
        f.write(html.replace('id="streambatch.streaming.CacheError"', 'id="gone"'))
    assert tool.check_site(no_entry) == ["the API reference has no entry for CacheError"]
    no_index = str(tmp_path / "no-index")
    shutil.copytree(site, no_index)
    os.remove(os.path.join(no_index, "search", "search_index.json"))
    assert tool.check_site(no_index) == ["no search index (search/search_index.json)"]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install -y chromium)")
def test_chromium_renders_the_front_page_and_the_api(built, tmp_path):
    tool, site = built
    with tool.serve(site) as url:
        problems = tool.render(tool.chromium(), url, str(tmp_path), str(tmp_path / "profile"))
    assert problems == []
    for name in tool.PAGES:
        assert (tmp_path / name).stat().st_size > 20_000
