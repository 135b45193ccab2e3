"""What flowmagic knows, printed: `flowmagic log` (the call log) and `flowmagic models` (the
endpoints, local servers and prices)."""

from __future__ import annotations

import argparse
import json
import time

from ..errors import ConfigError
from .._internal.text import one_line

__all__ = ["cmd_log", "cmd_models", "add_parsers"]


def cmd_models(args: argparse.Namespace) -> int:
    from ..view.display import models_report

    print(models_report(("OPENAI_API_KEY", "FLOWMAGIC_API_KEY")).text)
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from ..store import get_store

    store = get_store()
    if args.what == "path":
        print(store.path)
        return 0
    if args.n < 1:
        raise ConfigError(f"log -n takes a number of calls, 1 or more, not {args.n}")
    run_id = store.load_run(args.run)["id"] if args.run else None
    rows = store.recent_calls(args.n, run_id=run_id, model=args.model, query=args.query)
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False, default=str))
        return 0
    if not rows:
        filtered = args.model or args.run or args.query
        print("no model call matches" if filtered else "no model calls logged yet")
        return 0
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["ts"]))
        state = "cache" if row["cached"] else ("ERROR" if row["error"] else "call")
        last = row["messages"][-1]["content"] if row["messages"] else ""
        print(f"#{row['id']} {when} {state:5} {row['model']} "
              f"in={row['input_tokens'] or 0} out={row['output_tokens'] or 0} "
              f"{(row['latency_s'] or 0):.2f}s ${(row['cost_usd'] or 0):.6f}  "
              f"{one_line(last, 60)}")
    return 0


def add_parsers(sub) -> None:
    """`log` and `models`."""
    log = sub.add_parser("log", help="recent model calls, newest first",
                         description="The newest model calls, filtered by model, run and text; "
                         "`flowmagic log path` prints where the store is.")
    log.add_argument("what", nargs="?", choices=("path",), metavar="path",
                     help="print the path of the store (flowmagic.db) and nothing else")
    log.add_argument("-n", type=int, default=10, help="how many calls (default 10)")
    log.add_argument("-m", "--model", help="only calls to this model")
    log.add_argument("-r", "--run", help="only calls of this run (id or flow name)")
    log.add_argument("-q", "--query", help="only calls whose prompt or answer holds this text")
    log.add_argument("--json", action="store_true", help="print JSON")
    log.set_defaults(func=cmd_log)


    models = sub.add_parser("models", help="the endpoints, the local servers found running, "
                                          "and the model prices")
    models.set_defaults(func=cmd_models)
