"""The ``streambatch`` command line: ``demo``, ``plan``, ``bench``, ``index``, ``calibrate`` and ``preflight``.

Thin glue: argument parsing, one-line errors and printing. The work is done
by ``make_plan``, the streaming package and one module per subcommand in
this package (each with its ``add_parser``); shared argument types and
groups are in ``args.py``.

User mistakes (bad arguments, unreadable or malformed inputs) print one line,
``streambatch: error: ...``, on stderr and exit with status 2; set
``STREAMBATCH_TRACEBACK=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..core.redact import scrub, scrub_exception
from .args import PROG, Formatter, Parser

# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    from ..planners import PLANNERS, SEED_EXACT
    from . import bench, calibrate, demo, index, plan, preflight, warmup

    planners = sorted(PLANNERS)
    p = Parser(prog=PROG, formatter_class=Formatter, description=(
        "Token-budget batch planning for speech and audio training.\n\n"
        "  streambatch demo                                   see the whole job on a generated corpus\n"
        "  streambatch plan LENGTHS --max-batch-tokens T      quality of a plan for your lengths\n"
        "  streambatch bench                                  planning speed at scale\n"
        "  streambatch index 'shards-{000000..000099}.tar'    write sidecar indexes for streaming\n"
        "  streambatch calibrate --script my_step.py:make_step  fit the cost of your model's step\n"
        "  streambatch calibrate --memory --script ...        fit its peak memory and the limit per length\n"
        "  streambatch preflight LENGTHS --script ...         run a plan's worst batches before training\n"
        "  streambatch warmup                                 compile every kernel into the Numba cache"))
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo.add_parser(sub, planners, recommended_planner(planners))
    plan.add_parser(sub, planners, SEED_EXACT)
    bench.add_parser(sub, planners)
    index.add_parser(sub)
    calibrate.add_parser(sub)
    preflight.add_parser(sub, planners, SEED_EXACT)
    warmup.add_parser(sub)
    return p


def recommended_planner(planners: list[str]) -> str:
    """The planner the README recommends for new runs when installed, else the seed-exact default."""
    from ..planners import RECOMMENDED, SEED_EXACT

    return RECOMMENDED if RECOMMENDED in planners else SEED_EXACT


def _version() -> str:
    from .. import __version__

    return __version__


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 user error)."""
    args = build_parser().parse_args(argv)
    try:
        module, name = args.run  # imported only when run: `--help` stays light
        return getattr(importlib.import_module(f".{module}", __package__), name)(args) or 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `streambatch plan ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, OSError, ImportError, LookupError, MemoryError) as exc:
        if os.environ.get("STREAMBATCH_TRACEBACK"):
            scrub_exception(exc)
            raise
        print(f"{PROG}: error: {scrub(_one_line(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug's traceback still goes out, without the credentials of any URL in it
        scrub_exception(exc)
        raise


# The library's messages name Python arguments; on the command line, say the flags.
_FLAG_WORDS = (
    ("pass frames_per_second", "pass --frames-per-second"),
    ("choose another length_from", "choose another --length-from"),
    (" (or streambatch.index_shards(...))", ""),
    (", or pass index_missing=True to index local shards on the fly", ""),
)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        msg = f"{exc.filename}: {exc.strerror}"
    else:
        msg = str(exc) or type(exc).__name__
    for api, flag in _FLAG_WORDS:
        msg = msg.replace(api, flag)
    return " ".join(msg.split())


if __name__ == "__main__":
    sys.exit(main())
