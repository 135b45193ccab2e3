"""Commands on a stored run: `flowmagic export` (a notebook that replays it, optionally run
again) and `flowmagic map` (the run's workflow once per row of a data file, on Dask)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .notebooks import execute_notebook
from .progress import Progress
from ..magic_grammar import add_map_options, map_options
from ..model.status import RunState

__all__ = ["cmd_export", "cmd_map", "add_parsers"]


def cmd_export(args: argparse.Namespace) -> int:
    from ..flow import load
    from ..ops.export import export

    flow = load(args.run)
    path = export(flow, args.path, name=args.name)
    print(f"wrote {path} ({flow.counts().get('done', 0)}/{flow.total()} nodes done in run "
          f"{flow.run_id})")
    if args.execute:
        from ..ops.codecells import EXECUTE_ENV

        from .._internal.nbformat_import import nbformat

        from ..ops.nbsession import mismatches

        recorded = nbformat.read(str(path), as_version=4)
        # the kernel inherits it: every %%flow_code cell runs its code again, in the sandbox
        before, os.environ[EXECUTE_ENV] = os.environ.get(EXECUTE_ENV), "1"
        try:
            with Progress() as progress:
                stats = execute_notebook(path, None, [], progress, args.timeout)
        finally:
            if before is None:
                os.environ.pop(EXECUTE_ENV, None)
            else:
                os.environ[EXECUTE_ENV] = before
        print(f"ran it in a kernel, the code cells again in the sandbox: {stats['calls']} model "
              f"calls, {stats['seconds']:.1f} s")
        differ = mismatches(recorded, nbformat.read(str(path), as_version=4))
        for line in differ:
            print(line)
        codes = sum(1 for c in recorded.cells if c.cell_type == "code"
                    and c.source.startswith("%%flow_code"))
        print(f"{codes - len(differ)} of {codes} code cells printed what they printed in the run"
              + ("" if not differ else "; the cells above did not"))
        return 1 if differ else 0
    return 0


def cmd_map(args: argparse.Namespace) -> int:
    from ..flow import load
    from ..ops.distributed import write_results

    flow = load(args.run)
    out = Path(args.out or f"{flow.name}.map.csv")
    frame = flow.map_file(args.data, **map_options(args))
    write_results(frame, out)
    counts = frame["status"].value_counts().to_dict()
    print(f"wrote {out}: {len(frame)} rows, " + ", ".join(f"{n} {s}" for s, n in counts.items())
          + f"; ${frame['cost_usd'].sum():.4f} list price (`flowmagic log` shows the calls)")
    return 0 if counts.get(RunState.DONE, 0) == len(frame) else 1


def add_parsers(sub) -> None:
    """`export` and `map`."""
    export = sub.add_parser("export", help="write a stored run as a notebook that replays it")
    export.add_argument("run", metavar="RUN", help="run id or flow name (see `flowmagic log`)")
    export.add_argument("path", metavar="OUT.ipynb")
    export.add_argument("--name", help="the flow's variable name in the notebook")
    export.add_argument("--execute", action="store_true",
                        help="then run it in a kernel: text nodes replay, code cells run again in the sandbox")
    export.add_argument("--timeout", type=float, default=1800, help="seconds per notebook cell")
    export.set_defaults(func=cmd_export)


    mp = sub.add_parser("map", help="run a stored flow once per row of a data file on Dask",
                        description="Run the workflow of RUN once per row of DATA (.csv, "
                        ".parquet or .jsonl; columns fill {{field}}) on Dask: the scheduler "
                        "in FLOWMAGIC_DASK or --engine, else a LocalCluster. Resumable: rows "
                        "already done are not run again. Writes one row per input to OUT.")
    mp.add_argument("run", metavar="RUN", help="run id or flow name (see `flowmagic log`)")
    mp.add_argument("data", metavar="DATA")
    mp.add_argument("--out", help="results file, .csv/.parquet/.jsonl (default NAME.map.csv)")
    add_map_options(mp)
    mp.set_defaults(func=cmd_map)
