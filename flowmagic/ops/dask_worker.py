"""What runs on a Dask worker for `flow.map(engine="dask")` (see flowmagic.ops.distributed).

A worker process keeps, per map (its payload tag), one Flow with its own LLM and its own
SQLite store in the worker's local directory (SQLite is not shared over a network; Dask
deletes that directory when the worker closes). Each input runs through `batch.run_one`
and comes back as the batch Item plus every row of its run (`Store.export_run`), which the
driver merges into the user's store.

Keys: the payload carries the endpoints with their keys blanked. The keys travel once per
map in a `WorkerPlugin` (held in memory by the scheduler and the workers, never spilled to
disk like task data can be), and are put back into the worker's endpoints in memory only.

Cluster-wide limits: `ClusterGate` wraps each model request in `distributed.Semaphore`s
held on the scheduler, one per endpoint: `requests_at_once` leases for the requests in
flight, and `rpm` leases for requests per window, each released `window_s` after it was
taken, so every window of that length holds at most `rpm` requests across all workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pickle
import tempfile
import threading
from typing import Any

from distributed import WorkerPlugin

__all__ = ["KeyPlugin", "ClusterGate", "run_input", "run_partition"]

_lock = threading.Lock()
_keys: dict[str, dict[str, str]] = {}   # payload tag -> endpoint name -> key (memory only)
_flows: dict[str, Any] = {}             # payload tag -> this process's Flow for that map


class KeyPlugin(WorkerPlugin):
    """A Dask worker plugin that hands the endpoints' keys of one map to every worker,
    present and future (a restarted worker gets them again)."""

    def __init__(self, tag: str, keys: dict[str, str]):
        self.tag, self.keys = tag, keys
        self.name = f"flowmagic-keys-{tag}"

    def __repr__(self) -> str:   # never the keys
        return f"<KeyPlugin {self.tag}>"

    def setup(self, worker: Any = None) -> None:
        with _lock:
            _keys[self.tag] = dict(self.keys)

    def teardown(self, worker: Any = None) -> None:
        with _lock:
            _keys.pop(self.tag, None)
            _flows.pop(self.tag, None)


class ClusterGate:
    """Per-endpoint cluster-wide caps on model requests (see the module docstring)."""

    def __init__(self, rpm: int | None, at_once: int | None, window_s: float = 60.0):
        self.rpm, self.at_once, self.window_s = rpm, at_once, window_s
        self._sems: dict[tuple[str, str], Any] = {}

    def _sem(self, kind: str, identity: str, leases: int):
        from distributed import Semaphore

        with _lock:
            if (kind, identity) not in self._sems:
                self._sems[kind, identity] = Semaphore(max_leases=leases,
                                                       name=f"flowmagic-{kind}-{identity}")
            return self._sems[kind, identity]

    @contextlib.asynccontextmanager
    async def __call__(self, endpoint: Any):
        if self.rpm:
            window = self._sem("rpm", endpoint.identity, self.rpm)
            await asyncio.to_thread(window.acquire)
            timer = threading.Timer(self.window_s, window.release)   # the oldest lease
            timer.daemon = True
            timer.start()
        if not self.at_once:
            yield
            return
        flight = self._sem("at-once", endpoint.identity, self.at_once)
        await asyncio.to_thread(flight.acquire)
        try:
            yield
        finally:
            await asyncio.to_thread(flight.release)


def _folder() -> str:
    try:
        from distributed import get_worker
        return get_worker().local_directory
    except ValueError:   # not on a worker (a direct call): a temporary folder
        return tempfile.mkdtemp(prefix="flowmagic-worker-")


def _flow(payload: bytes, tag: str):
    """This process's Flow for a map: its own LLM, gate and store file."""
    with _lock:
        if tag in _flows:
            return _flows[tag]
        from ..flow import Flow
        from ..llm import endpoints
        from ..llm.client import LLM
        from ..store import Store

        spec = pickle.loads(payload)
        keys = _keys.get(tag, {})
        with endpoints._lock:
            endpoints._configured.clear()
            endpoints._configured.update({
                name: dataclasses.replace(e, api_key=keys.get(name, ""))
                for name, e in spec["endpoints"].items()})
        endpoints.PRICES.update(spec["prices"])
        store = Store(os.path.join(_folder(), f"flowmagic-{tag}.db"))
        llm = LLM(store, rpm=None, concurrency=spec["llm_concurrency"])
        llm.gate = ClusterGate(spec["rpm"], spec["at_once"], spec["window_s"])
        flow = Flow(spec["workflow"], name=spec["name"], llm=llm, store=store, save=False,
                    **spec["settings"])
        if spec["tools"] is not None:   # else the tools registered in this process
            flow.tools = spec["tools"]
        _flows[tag] = flow
        return flow


async def _one(flow, fingerprint: str, index: int, example: Any) -> dict:
    from .batch import run_one

    item = await run_one(flow, flow.workflow, example, index)
    return {"fingerprint": fingerprint, "item": item.to_dict(),
            "export": flow.store.export_run(item.run_id)}


def run_input(payload: bytes, tag: str, fingerprint: str, index: int, example: Any) -> dict:
    """One input (a Dask task): its batch Item as a dict and every row of its run."""
    flow = _flow(payload, tag)

    async def main():
        try:
            return [await _one(flow, fingerprint, index, example)]
        finally:
            await flow.llm.aclose()

    return {"results": asyncio.run(main())}


def run_partition(payload: bytes, tag: str, base: str, done: set, frame: Any, number: int,
                  concurrency: int) -> dict:
    """One partition of a Dask DataFrame, on the worker that holds it: its rows, and per
    row the result of `run_input` (or a resumed marker for a row already done)."""
    from .batch import fingerprint

    flow = _flow(payload, tag)
    rows = [{str(k): v for k, v in r.items()} for r in frame.to_dict("records")]
    prints = [fingerprint(base, x) for x in rows]

    async def main():
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> dict:
            if prints[i] in done:
                return {"fingerprint": prints[i], "resumed": True}
            async with gate:
                return await _one(flow, prints[i], number * 1_000_000 + i, rows[i])

        try:
            return await asyncio.gather(*(one(i) for i in range(len(rows))))
        finally:
            await flow.llm.aclose()

    return {"rows": rows, "results": asyncio.run(main())}
