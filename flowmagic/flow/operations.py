"""`Operations`: the work on a whole flow that ops/ does, asked from the flow: batches over
many inputs (also on Dask), a probe set, node importance and slimming, export to a notebook.

ops/ sits below the facade and is handed the flow; these methods reach it through a plain
import the layer contracts check, and add only what a user sees here: the progress bars and
the checks of the options.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from .. import ops
from .._internal.bars import progress_bar, ticking
from ..errors import ConfigError

__all__ = ["Operations"]


class Operations:
    """A Flow's operations on itself as a whole: `map`, `map_file`, `amap` (ops.batch,
    ops.distributed), `attach_probe`, `importance`, `aimportance`, `slim`, `aslim`
    (ops.slimming), `to_notebook` (ops.export). Mixed into `Flow`: it hands the flow itself
    to ops/ and keeps the results it is asked to keep (`probe`, `last_slim`)."""

    def map(self, inputs, concurrency: int | None = 4, scorer: Any = None,
            engine: Any = "inprocess", **options: Any):
        """This workflow once per input ({{input}}/{{field}} filled in); a BatchRun in input order.

        `engine="dask"` (or a dask.distributed.Client) runs the inputs on Dask and returns a
        pandas DataFrame in input order, resumable, with `budget_usd`, `progress`, `rpm` and
        `requests_at_once` options (see flowmagic.ops.distributed.dask_map)."""
        if engine != "inprocess":
            if scorer is not None:
                raise ConfigError("map(engine='dask') does not score yet; use the in-process "
                                  "engine (engine='inprocess') with a scorer")
            return ops.dask_map(self, inputs, engine=engine, concurrency=concurrency,
                                **options)
        if options:
            raise ConfigError(f"map() options {sorted(options)} are for engine='dask'; "
                              "drop them or pass engine='dask'")
        size = len(inputs) if hasattr(inputs, "__len__") else None
        with progress_bar(f"{self.name}: map", size, "input") as bar:
            return ops.run_sync(self, lambda: ops.amap(
                self, inputs, concurrency=concurrency, scorer=scorer,
                progress=ticking(bar, None)), "map")

    def map_file(self, path, engine: Any = "dask", **options: Any):
        """`map` over the rows of a .csv, .parquet or .jsonl file (columns as {{field}});
        a DataFrame in row order (`flowmagic map` and `%flow map` call this)."""
        return ops.map_file(self, path, engine=engine, **options)

    async def amap(self, inputs, concurrency: int | None = 4, scorer: Any = None):
        """map() awaited on the current loop (in-process; no progress bar): a BatchRun."""
        return await ops.amap(self, inputs, concurrency=concurrency, scorer=scorer)

    def attach_probe(self, examples, scorer: Any, n: int | None = None, seed: int = 0):
        """Keep a probe set (a seeded shuffle of `examples`, first n) for importance() and slim()."""
        self.probe = ops.probe_set(examples, scorer, n=n, seed=seed)
        self.emit("probe", None, {"size": len(self.probe), "seed": seed})
        return self.probe

    def importance(self, probe: Any = None, scorer: Any = None, **options: Any):
        """The node importance table (see flowmagic.ops.slimming.aimportance for the options)."""
        with progress_bar(f"{self.name}: importance", unit="configuration") as bar:
            told = options.get("progress") or partial(self.emit, "slim", None)
            options["progress"] = ticking(bar, told, _evaluated)
            return ops.run_sync(self, lambda: self.aimportance(probe, scorer, **options),
                                "importance")

    async def aimportance(self, probe: Any = None, scorer: Any = None, **options: Any):
        """importance() awaited on the current loop."""
        options.setdefault("progress", partial(self.emit, "slim", None))
        return await ops.aimportance(self, ops.resolve_probe(self, probe, scorer), **options)

    def slim(self, probe: Any = None, scorer: Any = None, **options: Any):
        """(slimmed Flow, SlimReport), also kept as `last_slim`; this flow's workflow is
        untouched (see flowmagic.ops.slimming.aslim)."""
        with progress_bar(f"{self.name}: slim", unit="configuration") as bar:
            told = options.get("progress") or partial(self.emit, "slim", None)
            options["progress"] = ticking(bar, told, _evaluated)
            return ops.run_sync(self, lambda: self.aslim(probe, scorer, **options), "slim")

    async def aslim(self, probe: Any = None, scorer: Any = None, **options: Any):
        """slim() awaited on the current loop; also kept as `last_slim`."""
        options.setdefault("progress", partial(self.emit, "slim", None))
        self.last_slim = await ops.aslim(self, ops.resolve_probe(self, probe, scorer), **options)
        return self.last_slim

    def to_notebook(self, path, **options: Any):
        """Write the executed workflow as a notebook whose cells replay it (flowmagic.ops.export)."""
        return ops.export_notebook(self, path, **options)


def _evaluated(event: Any) -> bool:
    """A step of slim's and importance's bars: one configuration scored on the probe set."""
    return isinstance(event, dict) and event.get("phase") == "evaluated"
