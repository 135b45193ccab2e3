"""The `flowmagic` command. Each subcommand is one function `cmd_NAME(args)`, in
the module of its group: `tasks` (run, plan), `runs` (export, map), `info` (log, models),
`notebooks` (templates, new), `evaluation` (eval, trials, study).

Results go to stdout, progress (one line per node event or notebook cell, and a
"still working" line when nothing happened for a while) to stderr, so `> file` keeps
only the results.
"""

from __future__ import annotations

import argparse
import sys

from . import evaluation, info, notebooks, runs, tasks
from ..errors import FlowError
from .._internal.version import __version__

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowmagic", description="Plan, run and export multi-agent task graphs.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=30))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"flowmagic {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for group in (tasks, runs, info, notebooks, evaluation):   # the order of --help
        group.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.out_given = any(a == "--out" or a.startswith("--out=") for a in argv)
    try:
        return int(args.func(args) or 0)
    except FlowError as exc:
        if args.debug:
            raise
        from ..llm.endpoints import scrub

        print(f"flowmagic: {scrub(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("flowmagic: interrupted; everything finished so far is in the store", file=sys.stderr)
        return 130

