"""`flow.map(inputs, engine="dask")`: the batch of flowmagic.ops.batch on a Dask cluster.

Where the engine comes from: a `dask.distributed.Client` passed as `engine=`; else the
scheduler address in `FLOWMAGIC_DASK` (``tcp://host:8786``); else a LocalCluster of worker
processes started for this map and closed after it. Dask schedules: one task per input,
collected with `as_completed`; the driver only puts the rows back in input order.

What a task carries: the workflow (pickled), the flow's settings, and the configured
endpoints and prices, so a worker calls the same models as the driver. The endpoint's key
is in the payload in memory only. Each worker process keeps one LLM and its own SQLite
store in a temporary folder (SQLite is not shared over a network); a worker's calls are
not yet merged into the user's store.

The answer is a pandas DataFrame, one row per input in input order: the input's fields,
`result`, `status`, `tokens_in`, `tokens_out`, `cost_usd`, `time_s`, `error`, and one
`node:<id>` column per node with that node's output.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import tempfile
import threading
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..flow import Flow

__all__ = ["dask_map", "to_inputs", "ENV"]

ENV = "FLOWMAGIC_DASK"
ROW_COLUMNS = ("result", "status", "tokens_in", "tokens_out", "cost_usd", "time_s", "error")


# -- the driver ---------------------------------------------------------------------------
def to_inputs(inputs: Any) -> tuple[list, list[str]]:
    """(one input per row, the field names) from a list, a pandas or a Dask DataFrame."""
    if hasattr(inputs, "compute") and hasattr(inputs, "npartitions"):
        inputs = inputs.compute()   # a Dask DataFrame: gathered to the driver for now
    if hasattr(inputs, "to_dict") and hasattr(inputs, "columns"):
        fields = [str(c) for c in inputs.columns]
        return [{str(k): v for k, v in row.items()} for row in inputs.to_dict("records")], fields
    if isinstance(inputs, (str, bytes, dict)):
        raise ConfigError("map() takes many inputs: a list, a pandas or a Dask DataFrame; "
                          "wrap a single input in a list")
    return list(inputs), []


def _client(engine: Any, threads: int):
    """(Client, cluster we started or None) for `engine`."""
    from dask.distributed import Client, LocalCluster

    if isinstance(engine, Client):
        return engine, None
    if engine != "dask":
        raise ConfigError(f"engine {engine!r} is not 'inprocess', 'dask' nor a "
                          "dask.distributed.Client")
    address = os.environ.get(ENV, "").strip()
    if address:
        try:
            return Client(address, timeout="10s"), None
        except OSError as exc:
            raise ConfigError(f"{ENV}={address} : no Dask scheduler answered ({exc}); start one "
                              f"(`dask scheduler`) or unset {ENV} for a local cluster") from None
    cluster = LocalCluster(n_workers=min(2, os.cpu_count() or 1), threads_per_worker=threads,
                           processes=True, dashboard_address=None)
    return Client(cluster), cluster


def dask_map(flow: "Flow", inputs: Any, *, engine: Any = "dask", concurrency: int | None = 4):
    """Run the flow's workflow once per input on Dask; a DataFrame in input order."""
    import pandas as pd
    from dask.distributed import as_completed

    from ..llm import endpoints

    rows, fields = to_inputs(inputs)
    if not rows:
        raise ConfigError("map() needs at least one input")
    if concurrency is not None and int(concurrency) < 1:
        raise ConfigError("concurrency must be at least 1 (or None for no limit)")
    payload = pickle.dumps({"workflow": flow.workflow, "name": flow.name,
                            "settings": flow.settings,
                            "endpoints": dict(endpoints._configured),
                            "prices": dict(endpoints.PRICES)})
    tag = hashlib.sha256(payload).hexdigest()[:12]
    client, cluster = _client(engine, int(concurrency or 4))
    try:
        shipped = client.scatter(payload, broadcast=True)
        futures = [client.submit(_run_input, shipped, tag, i, x, key=f"flowmagic-{tag}-{i}",
                                 pure=False)
                   for i, x in enumerate(rows)]
        items: list[dict | None] = [None] * len(rows)
        for future in as_completed(futures):
            item = future.result()
            items[item["index"]] = item
    finally:
        if cluster is not None:
            client.close()
            cluster.close()
    return _frame(pd, rows, fields, items)


def _frame(pd, rows: list, fields: list[str], items: list[dict]):
    node_ids: list[str] = []
    for item in items:
        node_ids += [n for n in item["outputs"] if n not in node_ids]
    table = []
    for example, item in zip(rows, items):
        row = dict(example) if fields else {"input": example}
        row.update(result=item["result"], status=item["state"], tokens_in=item["tokens_in"],
                   tokens_out=item["tokens_out"], cost_usd=item["cost_usd"],
                   time_s=item["duration_s"], error=item["error"])
        row.update({f"node:{n}": item["outputs"].get(n) for n in node_ids})
        table.append(row)
    return pd.DataFrame(table)


# -- a worker -------------------------------------------------------------------------------
_worker_lock = threading.Lock()
_worker_flows: dict[str, Any] = {}   # payload tag -> (parent Flow, workflow) in this process


def _worker_flow(payload: bytes, tag: str):
    """This worker's Flow for a payload: its own LLM and a store file of its own."""
    with _worker_lock:
        if tag not in _worker_flows:
            from ..flow import Flow
            from ..llm import endpoints
            from ..llm.client import LLM
            from ..store import Store

            spec = pickle.loads(payload)
            with endpoints._lock:
                endpoints._configured.clear()
                endpoints._configured.update(spec["endpoints"])
            endpoints.PRICES.update(spec["prices"])
            folder = tempfile.mkdtemp(prefix="flowmagic-worker-")
            store = Store(os.path.join(folder, "flowmagic.db"))
            flow = Flow(spec["workflow"], name=spec["name"], llm=LLM(store), store=store,
                        save=False, **{k: v for k, v in spec["settings"].items()})
            _worker_flows[tag] = flow
        return _worker_flows[tag]


def _run_input(payload: bytes, tag: str, index: int, example: Any) -> dict:
    """One input on this worker (a Dask task): the batch Item as a dict."""
    from .batch import run_one

    flow = _worker_flow(payload, tag)

    async def one():
        try:
            return await run_one(flow, flow.workflow, example, index)
        finally:
            await flow.llm.aclose()

    return asyncio.run(one()).to_dict()
