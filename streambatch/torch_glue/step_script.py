"""The user's training step, named on the command line as ``FILE.py:FUNC``.

``FUNC()`` returns ``step(batch_size, length)``: one forward + backward +
optimizer step of the user's model on a batch of that shape. ``streambatch
calibrate`` times it, ``calibrate --memory`` and ``preflight`` measure its
memory (in this process, or in a subprocess per shape: ``memory_probe.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any


def check_spec(spec: Any) -> tuple[str, str]:
    """(path, function name) of a ``FILE.py:FUNC`` spec, or ValueError."""
    if not isinstance(spec, str):
        raise TypeError(f"a step script is named FILE.py:FUNCTION (e.g. my_step.py:make_step), got {spec!r}")
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ValueError(f"--script takes FILE.py:FUNCTION (e.g. my_step.py:make_step), got {spec!r}")
    if not os.path.isfile(path):
        raise ValueError(f"--script {spec!r}: no such file {path!r}")
    return path, name


def load_step(spec: str) -> Callable[[int, int], Any]:
    """``FILE.py:FUNC`` -> the step function ``FUNC()`` returns."""
    path, name = check_spec(spec)
    module_spec = importlib.util.spec_from_file_location("streambatch_user_step", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # the script's own imports, as `python FILE` would
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    make = getattr(module, name, None)
    if not callable(make):
        raise ValueError(f"--script {spec!r}: {path} defines no function {name!r}")
    step = make()
    if not callable(step):
        raise TypeError(f"--script {spec!r}: {name}() must return a function step(batch_size, length), "
                        f"got {type(step).__name__}")
    return step
