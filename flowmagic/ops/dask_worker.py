"""What runs on a Dask worker for `flow.map(engine="dask")` (see flowmagic.ops.distributed).

A worker process keeps, per map (its payload tag), one `_Runner`: a Flow with its own LLM
and its own SQLite store in the worker's local directory (SQLite is not shared over a
network), and one event loop in a thread of its own that lives as long as the map. A task
is a chunk of inputs (or a Dask DataFrame partition): its inputs run on that loop through
`batch.run_one`, at most `concurrency` at once per worker whatever the number of chunks,
with the same HTTP clients for the whole map, and come back as the batch Items plus every
row of their runs (`Store.export_run`), which the driver merges into the user's store.
When the map ends its plugin's teardown closes the loop and deletes the store file, so a
long-lived cluster does not keep a Flow per map.

What every task of a map shares (the payload: workflow, settings, tools, endpoints with their
keys blanked) and the keys travel once per map in a `WorkerPlugin`, which every worker gets,
present and future (held in memory by the scheduler and the workers, never spilled to disk
like task data can be); the keys are put back into the worker's endpoints in memory only.
The tasks themselves depend on nothing but their inputs, so Dask puts each on the least busy
worker (a payload task would draw every task to the worker holding it).

Cluster-wide limits: `ClusterGate` wraps each model request in `distributed.Semaphore`s
held on the scheduler, one per endpoint: as many leases for the requests in flight as the
endpoint takes at once (the lowest of `requests_at_once`, its `concurrency` and a
self-hosted server's slots, see distributed._caps), and `rpm` leases for requests per
window, each released `window_s` after it was taken, so every window of that length holds
at most `rpm` requests across all workers.
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

from ..model.status import RunState

__all__ = ["MapPlugin", "ClusterGate", "run_chunk", "run_partition", "partition_prints"]

_lock = threading.Lock()
_maps: dict[str, tuple[bytes, dict[str, str]]] = {}   # payload tag -> (payload, keys by endpoint)
_runners: dict[str, "_Runner"] = {}     # payload tag -> this process's runner for that map


class MapPlugin(WorkerPlugin):
    """A Dask worker plugin that hands one map's payload and its endpoints' keys to every
    worker, present and future (a restarted worker gets them again); its teardown, when
    the map ends, closes that map's runner in the worker."""

    def __init__(self, tag: str, payload: bytes, keys: dict[str, str]):
        self.tag, self.payload, self.keys = tag, payload, keys
        self.name = f"flowmagic-map-{tag}"

    def __repr__(self) -> str:   # never the keys
        return f"<MapPlugin {self.tag}>"

    def setup(self, worker: Any = None) -> None:
        with _lock:
            _maps[self.tag] = (self.payload, dict(self.keys))

    def teardown(self, worker: Any = None) -> None:
        with _lock:
            _maps.pop(self.tag, None)
            runner = _runners.pop(self.tag, None)
        if runner is not None:
            runner.close()


class ClusterGate:
    """Per-endpoint cluster-wide caps on model requests (see the module docstring):
    `caps` by endpoint identity, `at_once` for an endpoint not in it."""

    def __init__(self, rpm: int | None, at_once: int | None, window_s: float = 60.0,
                 caps: dict[str, int] | None = None):
        self.rpm, self.at_once, self.window_s = rpm, at_once, window_s
        self.caps = dict(caps or {})
        self._sems: dict[tuple[str, str], Any] = {}

    def _sem(self, kind: str, identity: str, leases: int):
        """The scheduler's semaphore for this limit. Its name holds the limit itself: the
        scheduler refuses a semaphore of the same name with other leases, so a later map
        with another limit on a long-lived cluster would fail every request."""
        from distributed import Semaphore

        with _lock:
            if (kind, identity) not in self._sems:
                self._sems[kind, identity] = Semaphore(
                    max_leases=leases, name=f"flowmagic-{kind}-{leases}-{identity}")
            return self._sems[kind, identity]

    @contextlib.asynccontextmanager
    async def __call__(self, endpoint: Any):
        if self.rpm:
            window = self._sem(f"rpm-per-{self.window_s:g}s", endpoint.identity, self.rpm)
            await asyncio.to_thread(window.acquire)
            timer = threading.Timer(self.window_s, window.release)   # the oldest lease
            timer.daemon = True
            timer.start()
        leases = self.caps.get(endpoint.identity, self.at_once)
        if not leases:
            yield
            return
        flight = self._sem("at-once", endpoint.identity, leases)
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


class _Runner:
    """One map in one worker process: its Flow, and the event loop (in a thread of its
    own) on which every input of that map runs, so the LLM's HTTP clients, semaphores and
    the store's connection are made once per map, not once per input."""

    def __init__(self, payload: bytes, keys: dict[str, str], tag: str):
        from ..llm import endpoints
        from ..llm.client import LLM
        from ..store import Store

        spec = pickle.loads(payload)
        endpoints.restore({name: dataclasses.replace(e, api_key=keys.get(name, ""))
                           for name, e in spec["endpoints"].items()})
        endpoints.PRICES.update(spec["prices"])
        endpoints.CACHED_PRICES.update(spec.get("cached_prices") or {})
        self.path = os.path.join(_folder(), f"flowmagic-{tag}.db")
        self.store = Store(self.path)
        llm = LLM(self.store, rpm=None, concurrency=spec["llm_concurrency"])
        llm.gate = ClusterGate(spec["rpm"], spec["at_once"], spec["window_s"], spec["caps"])
        self.flow = spec["flow_class"](spec["workflow"], name=spec["name"], llm=llm,
                                       store=self.store, save=False, **spec["settings"])
        if spec["tools"] is not None:   # else the tools registered in this process
            self.flow.tools = spec["tools"]
        self.concurrency = spec["concurrency"]
        self.loop = asyncio.new_event_loop()
        self._limit: asyncio.Semaphore | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name=f"flowmagic-map-{tag}")
        self._thread.start()

    def run(self, coro) -> Any:
        """Run a coroutine on this map's loop and wait for it (from a Dask task's thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def one(self, fingerprint: str, index: int, example: Any) -> dict:
        """One input, when one of this worker's `concurrency` places for the map is free."""
        from .batch import run_one

        if self._limit is None:
            self._limit = asyncio.Semaphore(self.concurrency)
        try:
            async with self._limit:
                item = await run_one(self.flow, self.flow.workflow, example, index)
        except Exception as exc:   # this input's own mistake (a missing field): its row says so
            return {"fingerprint": fingerprint, "export": None,
                    "item": {"state": RunState.FAILED, "error": f"{type(exc).__name__}: {exc}"}}
        return {"fingerprint": fingerprint, "item": item.to_dict(),
                "export": self.flow.store.export_run(item.run_id)}

    async def _shutdown(self) -> None:
        """Cancel what still runs (inputs of tasks the driver cancelled: their Dask threads
        wait on them), then close the HTTP clients."""
        me = asyncio.current_task()
        running = [t for t in asyncio.all_tasks() if t is not me]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self.flow.llm.aclose()

    def close(self) -> None:
        if self.loop.is_running():
            with contextlib.suppress(Exception):   # closing is best effort
                asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()
        self.store.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.remove(self.path + suffix)


def _runner(tag: str) -> _Runner:
    with _lock:
        if tag not in _maps:   # a task the driver cancelled, started after its map ended
            raise RuntimeError(f"the map {tag} has ended on this worker")
        if tag not in _runners:
            _runners[tag] = _Runner(*_maps[tag], tag)
        return _runners[tag]


def run_chunk(tag: str, chunk: list[tuple[str, int, Any]]) -> dict:
    """A chunk of inputs (a Dask task), each (fingerprint, index, input): per input its
    batch Item as a dict and every row of its run."""
    from .batch import gather_all

    runner = _runner(tag)
    return {"results": runner.run(gather_all([runner.one(*unit) for unit in chunk]))}


def _rows(frame: Any) -> list[dict]:
    return [{str(k): v for k, v in r.items()} for r in frame.to_dict("records")]


def partition_prints(base: str, frame: Any) -> list[str]:
    """The fingerprints of a Dask DataFrame partition's rows, on the worker that holds it."""
    from .batch import fingerprint

    return [fingerprint(base, x) for x in _rows(frame)]


def run_partition(tag: str, frame: Any, number: int, prints: list[str],
                  resumed: dict[str, dict], spec: dict,
                  not_run: tuple[str, str] | None = None) -> dict:
    """One partition of a Dask DataFrame, on the worker that holds it: its rows not in
    `resumed` are run (unless `not_run` = (state, why) says they are not), and it returns
    the runs (for the driver's store) and the partition of the answer, indexed as the
    input partition was (it stays on this worker)."""
    from .batch import gather_all, result_frame

    rows = _rows(frame)
    todo = [i for i, fp in enumerate(prints) if fp not in resumed]
    results: list[dict] = []
    if todo and not_run is None:
        runner = _runner(tag)
        results = runner.run(gather_all([runner.one(prints[i], number * 1_000_000 + i, rows[i])
                                         for i in todo]))
    items = dict(resumed)
    items.update({r["fingerprint"]: r["item"] for r in results})
    missing = {"state": not_run[0], "error": not_run[1]} if not_run else None
    answer = result_frame(rows, spec["fields"], [items.get(fp, missing) for fp in prints],
                          spec["nodes"])
    answer.index = frame.index
    return {"results": results, "frame": answer}
