"""Operations on a whole Flow: batches and probes (batch), slimming, export to a notebook
(export) and its replay (replay), notebooks as programs (nbrun).

This layer sits below `flowmagic.flow`: it is handed a Flow and works through its public API
(`Flow.derive`, `Flow.emit`, `type(flow)` for a replica, ...) and never imports it. The
functions below are what `Flow.map` (also on Dask), `attach_probe`, `importance`, `slim` and
`to_notebook` call: a plain import the layer contracts in pyproject.toml check. What drives
flows from above (trials, the comparison with baselines) is in `flowmagic.evaluate`.
"""

from __future__ import annotations

from typing import Any

from .._internal.extras import require

__all__ = ["amap", "dask_map", "map_file", "probe_set", "aimportance", "aslim", "resolve_probe", "export_notebook",
           "run_sync"]


async def amap(flow, inputs, **options: Any):
    """`flowmagic.ops.batch.amap`: the flow's workflow once per input."""
    from . import batch
    return await batch.amap(flow, inputs, **options)


def dask_map(flow, inputs, **options: Any):
    """`flowmagic.ops.distributed.dask_map`: the inputs on Dask, a DataFrame in input order."""
    require("distributed", "dask", "map on Dask")
    from . import distributed
    return distributed.dask_map(flow, inputs, **options)


def map_file(flow, path, **options: Any):
    """`flowmagic.ops.distributed.map_file`: `map` over the rows of a .csv, .parquet or
    .jsonl file."""
    require("pandas", "data", "map over a data file")
    if options.get("engine", "dask") != "inprocess":
        require("distributed", "dask", "map on Dask")
    from . import distributed
    return distributed.map_file(flow, path, **options)


def probe_set(examples, scorer: Any, **options: Any):
    """`flowmagic.ops.batch.probe_set`: a seeded shuffle of `examples`, first n."""
    from . import batch
    return batch.probe_set(examples, scorer, **options)


def run_sync(flow, make, name: str) -> Any:
    """`flowmagic.ops.batch.run_sync`: a coroutine run to its end from a script."""
    from . import batch
    return batch.run_sync(flow, make, name)


def resolve_probe(flow, probe: Any = None, scorer: Any = None):
    """`flowmagic.ops.slimming.resolve_probe`: the probe set to score a flow on."""
    from . import slimming
    return slimming.resolve_probe(flow, probe, scorer)


async def aimportance(flow, probe, **options: Any):
    """`flowmagic.ops.slimming.aimportance`: the node importance table."""
    from . import slimming
    return await slimming.aimportance(flow, probe, **options)


async def aslim(flow, probe, **options: Any):
    """`flowmagic.ops.slimming.aslim`: (slimmed Flow, SlimReport)."""
    from . import slimming
    return await slimming.aslim(flow, probe, **options)


def export_notebook(flow, path, **options: Any):
    """`flowmagic.ops.export.export`: the executed workflow as a replayable notebook. (Not
    named `export`: that name is the submodule's, `from flowmagic.ops import export`.)"""
    from .export import export
    return export(flow, path, **options)
