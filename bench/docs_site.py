"""Look at the documentation site as a reader would: build it, serve it, render it in headless Chromium.

    python bench/docs_site.py --out bench/out/site        # writes home.png, api.png and the built site there

Builds the site (``mkdocs build --strict``), checks that every page of the navigation was built and is linked
from the front page's navigation, that the search index holds every page and the API reference's names, and that
the API pages have an entry for every public name (``streambatch.__all__``, ``streambatch.streaming.__all__``);
then serves the site on 127.0.0.1 and has headless Chromium (Debian: ``apt-get install -y chromium
chromium-driver``) render the front page and the API reference to PNG screenshots, and its DOM after scripts ran
(the navigation and the search box must be there). Exits 1 naming what is missing. Needs the ``docs`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
PAGES = {"home.png": "", "api.png": "api/streaming/"}  # screenshot -> page


def build(site: str) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", site], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    if done.returncode != 0:
        raise SystemExit(f"mkdocs build --strict failed:\n{done.stderr[-3000:]}")


def nav_pages() -> list[str]:
    """The .md files of mkdocs.yml's nav, in order (commented-out entries excluded)."""
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        text = f.read().split("\nnav:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\s*-\s[^#\n]*?:?\s*([\w/.-]+\.md)\s*$", text, flags=re.M)


def url_of(page: str) -> str:
    return "" if page == "index.md" else page[: -len(".md")].removesuffix("index").rstrip("/") + "/"


def public_names() -> list[str]:
    sys.path.insert(0, ROOT)
    import streambatch
    import streambatch.streaming

    return sorted(set(streambatch.__all__) | set(streambatch.streaming.__all__))


def check_site(site: str) -> list[str]:
    """What is missing from a built site ([] when nothing is)."""
    problems = []
    pages = nav_pages()
    if len(pages) < 15:
        problems.append(f"the nav of mkdocs.yml lists only {len(pages)} pages")
    with open(os.path.join(site, "index.html"), encoding="utf-8") as f:
        home = f.read()
    for page in pages:
        url = url_of(page)
        if not os.path.isfile(os.path.join(site, url, "index.html")):
            problems.append(f"{page} was not built ({url}index.html)")
        if url and f'href="{url}"' not in home:
            problems.append(f"the front page's navigation does not link {url}")
    index_path = os.path.join(site, "search", "search_index.json")
    if not os.path.isfile(index_path):
        return problems + ["no search index (search/search_index.json)"]
    with open(index_path, encoding="utf-8") as f:
        docs = json.load(f)["docs"]
    located = {d["location"].split("#")[0] for d in docs}
    for page in pages:
        if url_of(page) not in located:
            problems.append(f"the search index has no entry for {url_of(page) or 'the front page'}")
    api_html = ""
    for page in ("api/index.html", "api/streaming/index.html"):
        with open(os.path.join(site, page), encoding="utf-8") as f:
            api_html += f.read()
    searchable = " ".join(d["location"] + " " + d.get("title", "") for d in docs)
    for name in public_names():
        if not re.search(rf'id="streambatch[\w.]*\.{re.escape(name)}"', api_html):
            problems.append(f"the API reference has no entry for {name}")
        if f".{name}" not in searchable:
            problems.append(f"the search index does not find {name}")
    return problems


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no line per request
        pass


@contextlib.contextmanager
def serve(site: str):
    handler = functools.partial(_Quiet, directory=site)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def render(browser: str, url: str, out: str, profile: str) -> list[str]:
    """Screenshots of PAGES into ``out``, and the problems seen in the rendered DOM."""
    problems = []
    flags = CHROMIUM_FLAGS + [f"--user-data-dir={profile}", "--window-size=1280,1000"]
    for name, page in PAGES.items():
        path = os.path.join(out, name)
        done = subprocess.run([browser, *flags, f"--screenshot={path}", url + page], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0 or not os.path.isfile(path) or os.path.getsize(path) < 20_000:
            problems.append(f"no screenshot of {url + page} ({done.stderr.strip()[-300:]})")
        dom = subprocess.run([browser, *flags, "--virtual-time-budget=5000", "--dump-dom", url + page],
                             capture_output=True, text=True, timeout=120).stdout
        if 'class="md-nav' not in dom:
            problems.append(f"{url + page}: no navigation in the rendered page")
        if 'data-md-component="search-query"' not in dom:
            problems.append(f"{url + page}: no search box in the rendered page")
        if page.startswith("api") and 'id="streambatch.streaming.StreamingBatches"' not in dom:
            problems.append(f"{url + page}: StreamingBatches is not rendered")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "site"), help="screenshots and the site")
    ap.add_argument("--no-browser", action="store_true", help="check the built site only")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    site = os.path.join(args.out, "html")
    build(site)
    problems = check_site(site)
    if not args.no_browser:
        browser = chromium()
        if browser is None:
            problems.append("no chromium on PATH (apt-get install -y chromium chromium-driver), or pass --no-browser")
        else:
            with serve(site) as url:
                problems += render(browser, url, args.out, os.path.join(args.out, "chromium-profile"))
    for p in problems:
        print(f"missing: {p}")
    if not problems:
        shots = ", ".join(os.path.join(args.out, n) for n in PAGES) if not args.no_browser else "none"
        print(f"site ok: {len(nav_pages())} pages, {len(public_names())} public names in the API reference; "
              f"screenshots: {shots}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
