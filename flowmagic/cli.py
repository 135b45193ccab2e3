"""The `flowmagic` command. Each subcommand is one function `cmd_NAME(args)`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from .errors import FlowError

__all__ = ["main", "build_parser"]


def _truncate(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_log(args: argparse.Namespace) -> int:
    from .store import get_store

    rows = get_store().recent_calls(args.n)
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False, default=str))
        return 0
    if not rows:
        print("no model calls logged yet")
        return 0
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["ts"]))
        state = "cache" if row["cached"] else ("ERROR" if row["error"] else "call")
        last = row["messages"][-1]["content"] if row["messages"] else ""
        print(f"#{row['id']} {when} {state:5} {row['model']} "
              f"in={row['input_tokens'] or 0} out={row['output_tokens'] or 0} "
              f"{(row['latency_s'] or 0):.2f}s ${(row['cost_usd'] or 0):.6f}  "
              f"{_truncate(last, 60)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowmagic", description="Plan, run and export multi-agent task graphs.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    log = sub.add_parser("log", help="recent model calls, newest first")
    log.add_argument("-n", type=int, default=10, help="how many calls (default 10)")
    log.add_argument("--json", action="store_true", help="print JSON")
    log.set_defaults(func=cmd_log)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except FlowError as exc:
        if args.debug:
            raise
        print(f"flowmagic: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("flowmagic: interrupted; everything finished so far is in the store", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
