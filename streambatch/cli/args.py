"""What every subcommand's arguments share: argument types that accept
``16_000`` and ``1e6``, a parser whose usage errors are one line, a help
formatter that shows defaults, and the planning argument group."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

PROG = "streambatch"


# ---------------------------------------------------------------- argument types


def number(text: str) -> float:
    try:
        return float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def whole(minimum: int | None) -> Callable[[str], int]:
    """Integers, also written 16_000 or 1e6 (sizes are easier to type so)."""
    def parse(text: str) -> int:
        v = number(text)
        if not math.isfinite(v) or v != int(v) or (minimum is not None and v < minimum):
            floor = "" if minimum is None else f" >= {minimum}"
            raise argparse.ArgumentTypeError(f"expected a whole number{floor}, got {text!r}")
        return int(v)

    parse.__name__ = "integer"  # what argparse names in "invalid integer value"
    return parse


def positive_float(text: str) -> float:
    v = number(text)
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v


def length_limit(text: str) -> str:
    """A length limit: a whole number of length units (1500, 1e4) or seconds (30s, 12.5s)."""
    body = text[:-1] if text.endswith("s") else text
    try:
        v = float(body.replace("_", ""))
    except ValueError:
        v = float("nan")
    if not math.isfinite(v) or v <= 0 or (body is text and v != int(v)):
        raise argparse.ArgumentTypeError(f"expected a length > 0 in length units (1500) or seconds (30s), got {text!r}")
    return f"{v:g}s" if body is not text else str(int(v))


def planner_option(text: str) -> tuple[str, Any]:
    """KEY=VALUE planner option; VALUE is read as JSON when it parses (0.05, true, "x"), else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. bucket_width=0.05), got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line naming the help to read."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see `{self.prog} --help`)\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; defaults shown where there is one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if not action.option_strings or d is None or d is False or d == [] or d is argparse.SUPPRESS \
                or "(default" in text:
            return text
        shown = " ".join(map(str, d)) if isinstance(d, list) else str(d)
        return f"{text} (default: {shown.replace('%', '%%')})"


def add_plan_args(p: argparse.ArgumentParser, planners: list[str], *, tokens: int | None, world: int, planner: str,
                  seed: int, tokens_help: str, world_help: str, seed_help: str = "planning seed") -> None:
    """The planning arguments ``plan`` and ``demo`` share (budget, cap, world, planner, seed)."""
    if tokens is None:
        p.add_argument("-t", "--max-batch-tokens", type=whole(1), required=True, metavar="T", help=tokens_help)
    else:
        p.add_argument("-t", "--max-batch-tokens", type=whole(1), default=tokens, metavar="T", help=tokens_help)
    p.add_argument("-b", "--max-batch-size", type=whole(1), default=64, metavar="B",
                   help="at most this many samples per batch")
    p.add_argument("-w", "--world-size", type=whole(1), default=world, metavar="W", help=world_help)
    p.add_argument("--planner", choices=planners, default=planner, help="batch planner")
    p.add_argument("-o", "--planner-option", type=planner_option, action="append", default=[], metavar="KEY=VALUE",
                   help="planner keyword option, repeatable (e.g. bucket_width=0.05 for the bucketed planner)")
    p.add_argument("--seed", type=whole(None), default=seed, metavar="S", help=seed_help)


def subparser(sub: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, formatter_class=Formatter, help=help, description=description)
