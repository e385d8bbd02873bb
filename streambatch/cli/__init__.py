"""The ``streambatch`` command line: ``main`` (``main.py``), one module per
subcommand (``demo``, ``plan``, ``index``, ``bench``), and what only the
command line uses: the quality report, the benchmark harness, manifest
readers and the demo corpus writer."""

from .main import main

__all__ = ["main"]
