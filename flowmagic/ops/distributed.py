"""`flow.map(inputs, engine="dask")`: the batch of flowmagic.ops.batch on a Dask cluster.

Where the engine comes from: a `dask.distributed.Client` passed as `engine=`; else the
scheduler address in `FLOWMAGIC_DASK` (``tcp://host:8786``); else a LocalCluster of worker
processes (one per core) started for this map and closed after it. Dask schedules: the
distinct inputs go in chunks, one task per chunk, cut as they are submitted
(flowmagic.ops.chunks: a few inputs at first, then up to two seconds of a worker's work,
shrinking towards the end); the driver keeps a few chunks per worker submitted (so a budget
can stop it), merges each finished chunk's runs into the user's store in one commit as it
arrives, and puts the rows back in input order. What runs on a worker is in
flowmagic.ops.dask_worker.

Resume: each input has a fingerprint (sha256 of the workflow, the settings, the models and
the input). A finished input is recorded in the user's store in the same commit as its
merged run, and a map started again (after Ctrl-C, a killed worker, a closed laptop) takes
it from there instead of running it. An input given twice runs once, and a chunk that Dask
retries after a worker died (its key is made of its inputs' fingerprints) is merged once.

The answer is a pandas DataFrame, one row per input in input order: the input's fields,
`result`, `status`, `tokens_in`, `tokens_out`, `cost_usd`, `time_s`, `error`, `run_id`,
`resumed`, and one `node:<id>` column per node with that node's output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError
from ..model.status import RunState, Status
from .batch import NOT_RUN, canonical, fingerprint, fresh_copy, result_frame
from .chunks import Chunks, Units

# "Flow" in annotations is flowmagic.flow.Flow: the layer above, which hands itself in.

__all__ = ["dask_map", "map_file", "to_inputs", "MapProgress", "read_inputs", "write_results",
           "batch_frame", "ENV", "task_payload"]

ENV = "FLOWMAGIC_DASK"
READERS = {".csv": "read_csv", ".parquet": "read_parquet", ".jsonl": "read_json"}


# -- inputs and fingerprints -------------------------------------------------------------
def to_inputs(inputs: Any) -> tuple[list, list[str]]:
    """(one input per row, the field names) from a list or a pandas DataFrame."""
    if hasattr(inputs, "to_dict") and hasattr(inputs, "columns"):
        fields = [str(c) for c in inputs.columns]
        return [{str(k): v for k, v in row.items()} for row in inputs.to_dict("records")], fields
    if isinstance(inputs, (str, bytes, dict)):
        raise ConfigError("map() takes many inputs: a list, a pandas or a Dask DataFrame; "
                          "wrap a single input in a list")
    return list(inputs), []


def read_inputs(path: str | os.PathLike):
    """A pandas DataFrame from a .csv, .parquet or .jsonl file (one input per row)."""
    import pandas as pd

    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in READERS:
        raise ConfigError(f"{path}: give the inputs as .csv, .parquet or .jsonl (one input "
                          "per row, columns as {{field}})")
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such file; check the path")
    try:
        return getattr(pd, READERS[suffix])(path, **({"lines": True} if suffix == ".jsonl" else {}))
    except (ValueError, OSError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path}: cannot read it as {suffix[1:]} ({first}); fix the file") from None


def map_file(flow: "Flow", path: str | os.PathLike, engine: Any = "dask", **options: Any):
    """`flow.map` over the rows of a data file; a DataFrame in row order on either engine."""
    frame = read_inputs(path)
    out = flow.map(frame, engine=engine, **options)
    return batch_frame(frame, out) if engine == "inprocess" else out


def batch_frame(inputs: Any, batch: Any):
    """The in-process engine's BatchRun as the DataFrame a Dask map returns."""
    rows, fields = to_inputs(inputs)
    return result_frame(rows, fields, [item.to_dict() for item in batch])


def write_results(frame: Any, path: str | os.PathLike) -> None:
    """Write a map's result frame as .csv, .parquet or .jsonl (by the file's suffix)."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True, force_ascii=False)
    else:
        raise ConfigError(f"{path}: results are written as .csv, .parquet or .jsonl; "
                          "choose one of those suffixes")


def _base(flow: "Flow", endpoints: dict) -> str:
    """What decides an input's answer besides the input: the workflow, settings and models."""
    return canonical({"workflow": fresh_copy(flow.workflow).to_dict(),
                       "settings": flow.settings.to_dict(),
                       "endpoints": {n: (e.identity, e.model) for n, e in endpoints.items()}})


# -- progress ---------------------------------------------------------------------------
@dataclass
class MapProgress:
    """Where a map stands: what a progress bar or line shows."""
    total: int
    done: int = 0
    failed: int = 0
    resumed: int = 0
    skipped: int = 0      # not submitted: the budget was reached
    cost_usd: float = 0.0
    started: float = dataclasses.field(default_factory=time.monotonic)
    dashboard: str | None = None
    budget_usd: float | None = None
    workers: int = 0      # the cluster's workers when the map started


    @property
    def finished(self) -> int:
        return self.done + self.failed + self.resumed + self.skipped

    @property
    def rate(self) -> float:
        """Inputs run per second (resumed ones excluded)."""
        elapsed = time.monotonic() - self.started
        return (self.done + self.failed) / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        left = self.total - self.finished
        return left / self.rate if self.rate > 0 else None

    def line(self) -> str:
        eta = "?" if self.eta_s is None else f"{self.eta_s:.0f}s"
        parts = [f"map {self.finished}/{self.total}", f"done {self.done}",
                 f"failed {self.failed}", f"resumed {self.resumed}",
                 f"{self.rate:.2f}/s", f"${self.cost_usd:.4f}", f"ETA {eta}"]
        if self.skipped:
            parts.append(f"{self.skipped} not run (budget ${self.budget_usd:g} reached)")
        if self.workers:
            parts.append(f"{self.workers} worker{'s' * (self.workers != 1)}")
        return " | ".join(parts)


def _print_line(progress: MapProgress) -> None:
    end = "\n" if progress.finished == progress.total else ""
    print(f"\r{progress.line()}", end=end, file=sys.stderr, flush=True)


def _reporter(progress: Any) -> Callable[[MapProgress], None]:
    if progress is None or progress is True:
        return _print_line
    if progress is False:
        return lambda p: None
    if callable(progress):
        return progress
    raise ConfigError(f"progress={progress!r}: give True, False or a function(MapProgress)")


# -- the cluster ----------------------------------------------------------------------------
def _address(engine: Any) -> str | None:
    """The scheduler address a map goes to: `engine` itself ("tcp://host:8786"), else
    $FLOWMAGIC_DASK for engine="dask"; None for a Client or a LocalCluster of our own."""
    if isinstance(engine, str) and "://" in engine:
        return engine
    if engine == "dask":
        return os.environ.get(ENV, "").strip() or None
    if not hasattr(engine, "submit"):
        raise ConfigError(f"engine {engine!r} is not 'inprocess', 'dask', a scheduler address "
                          "(tcp://host:8786) nor a dask.distributed.Client")
    return None


def _client(engine: Any, threads: int, workers: int | None, current: bool = False):
    """(Client, what to close after the map: [client, cluster] we opened, or []).
    `current`: for engine="dask" without an address, the notebook's own Client when there
    is one (a Dask DataFrame's partitions live on its cluster)."""
    from dask.distributed import Client, LocalCluster, default_client

    address = _address(engine)
    if address is None and engine != "dask":
        return engine, []
    if address is None and current and workers is None:
        try:
            return default_client(), []
        except ValueError:   # no client in this process: a LocalCluster of our own
            pass
    if address:
        try:
            client = Client(address, timeout="10s")
        except OSError as exc:
            where = f"{ENV}={address}" if engine == "dask" else f"engine={address!r}"
            raise ConfigError(f"{where}: no Dask scheduler answered ({exc}); start one "
                              f"(`dask scheduler`) or use engine='dask' without {ENV} for a "
                              "local cluster") from None
        return client, [client]
    cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=threads,
                           processes=True, dashboard_address=":0")
    client = Client(cluster)
    return client, [client, cluster]


def _endpoints() -> dict:
    """The endpoints a worker needs: the configured ones, and the default as resolved here
    (from the environment, say), so workers call what the driver would."""
    from ..llm import endpoints

    found = endpoints.snapshot()
    if "default" not in found:
        default = endpoints.resolve_default()
        if not default.local:
            found["default"] = default
    return found


# -- the map ------------------------------------------------------------------------------------
def task_payload(flow: "Flow", found: dict, *, rpm: int | None = None,
                 at_once: int | None = None, window_s: float = 60.0,
                 concurrency: int = 4) -> bytes:
    """What every task of a map shares (pickled once, handed to every worker with the keys
    in a MapPlugin): the workflow, settings, the flow's chosen tools, endpoints with their
    keys blanked (and local or hosted as this process sees them: a worker's environment or
    network may say otherwise), prices, inputs at once per worker and the cluster-wide
    limits."""
    from ..llm import endpoints

    import cloudpickle   # Dask's own: the user's tool functions from a notebook go by value

    return cloudpickle.dumps({
        "flow_class": type(flow),   # by reference: the worker imports flowmagic as we do
        "workflow": fresh_copy(flow.workflow), "name": flow.name, "settings": flow.settings,
        "tools": flow.chosen_tools,
        "endpoints": {n: dataclasses.replace(e, api_key="", hosting="local" if e.self_hosted
                                             else "hosted") for n, e in found.items()},
        "prices": dict(endpoints.PRICES), "cached_prices": dict(endpoints.CACHED_PRICES),
        "llm_concurrency": flow.llm.concurrency,
        "rpm": rpm or flow.llm.rpm, "at_once": at_once, "caps": _caps(found, at_once),
        "window_s": window_s, "concurrency": concurrency})


def _caps(found: dict, at_once: int | None) -> dict[str, int]:
    """Requests at once per endpoint (by identity) across the whole cluster: the lowest of
    `requests_at_once`, the endpoint's own `concurrency` and, for a server the user runs,
    its slots (llm.queue). In process they hold for the process, which runs the whole map;
    on Dask each worker would hold them apart, and N workers send N times as many. The
    embedded model is left out: each worker process starts its own."""
    from ..llm import queue

    caps = {}
    for endpoint in found.values():
        if endpoint.local:
            continue
        limits = [n for n in (at_once, endpoint.concurrency) if n]
        if endpoint.self_hosted:
            limits.append(queue.slots_of(endpoint, endpoint.base_url))
        limits = [int(n) for n in limits if n]
        if limits:
            caps[endpoint.identity] = min(limits)
    return caps


def _is_dask_frame(inputs: Any) -> bool:
    return hasattr(inputs, "npartitions") and hasattr(inputs, "to_delayed")


def _check(engine, concurrency, rpm, requests_at_once, budget_usd, workers) -> None:
    if concurrency is not None and int(concurrency) < 1:
        raise ConfigError("concurrency must be at least 1 (or None for no limit)")
    if workers is not None and (engine != "dask" or os.environ.get(ENV, "").strip()):
        raise ConfigError("workers= sizes the LocalCluster flowmagic starts (engine='dask' "
                          f"without {ENV}); a cluster you give has its own workers")
    for name, value in (("rpm", rpm), ("requests_at_once", requests_at_once),
                        ("workers", workers)):
        if value is not None and int(value) < 1:
            raise ConfigError(f"{name} must be at least 1 (or None for no limit)")
    if budget_usd is not None and not (float(budget_usd) >= 0 and float(budget_usd) < float("inf")):
        raise ConfigError(f"budget_usd={budget_usd!r}: give a finite amount of dollars >= 0")


def dask_map(flow: "Flow", inputs: Any, *, engine: Any = "dask", concurrency: int | None = 4,
             budget_usd: float | None = None, progress: Any = None, rpm: int | None = None,
             requests_at_once: int | None = None, window_s: float = 60.0,
             workers: int | None = None):
    """Run the flow's workflow once per input on Dask; a DataFrame in input order.

    `engine`: "dask" ($FLOWMAGIC_DASK, else a LocalCluster of `workers` processes, one per
    core by default), a scheduler address or a Client; `concurrency`: inputs at once per
    worker (N workers run N times as many); `rpm` / `requests_at_once`, like the endpoint's
    own `concurrency` and a self-hosted server's slots: per endpoint, across the whole
    cluster (`_caps`);
    `budget_usd`: no new input is submitted once the list-price cost of this map reaches
    it; `progress`: True (a line on stderr), False, or a function called with a MapProgress
    after each result. A Dask DataFrame is run partition by partition where each partition
    is, and the answer is a Dask DataFrame whose partitions stay on the workers (see
    `_map_partitions`)."""
    _check(engine, concurrency, rpm, requests_at_once, budget_usd, workers)
    found = _endpoints()
    base = _base(flow, found)
    threads = int(concurrency or 4)
    job = _Job(flow, task_payload(flow, found, rpm=rpm, at_once=requests_at_once,
                                  window_s=window_s, concurrency=threads),
               {n: e.api_key for n, e in found.items() if e.api_key}, _reporter(progress),
               budget_usd)
    if _is_dask_frame(inputs):
        with job.session(engine, threads, workers, current=True) as client:
            return _map_partitions(job, client, inputs, base)
    rows, fields = to_inputs(inputs)
    if not rows:
        raise ConfigError("map() needs at least one input")
    prints = [fingerprint(base, x) for x in rows]
    job.items.update({fp: dict(item, resumed=True) for fp, item in
                      flow.store.map_done(list(dict.fromkeys(prints))).items()})
    job.state.total = len(rows)
    job.state.resumed = sum(fp in job.items for fp in prints)
    first = {fp: i for i, fp in reversed(list(enumerate(prints)))}
    todo = [(fp, first[fp], rows[first[fp]]) for fp in first if fp not in job.items]
    if todo:
        with job.session(engine, threads, workers) as client:
            job.drive(client, Chunks(todo, threads, job.state.workers,
                                     small=budget_usd is not None))
    job.state.skipped = sum(fp not in job.items for fp in prints)
    job.report(job.state)
    return result_frame(rows, fields, [job.items.get(fp) for fp in prints])


def _map_partitions(job: "_Job", client, inputs: Any, base: str):
    """A Dask DataFrame: each partition is fingerprinted, run and turned into its part of
    the answer on the worker that holds it. Only the runs travel to the driver (to be merged
    into the user's store); the answer is a Dask DataFrame over the result partitions, left
    on the workers, or gathered when the cluster closes with this map."""
    import dask.dataframe as dd
    import pandas as pd

    from .dask_worker import partition_prints

    datas = client.compute(inputs.to_delayed())   # each stays on the worker that makes it
    prints = client.gather([client.submit(partition_prints, base, d, retries=2) for d in datas])
    done = job.flow.store.map_done(list({fp for part in prints for fp in part}))
    job.state.total = sum(map(len, prints))
    job.state.resumed = sum(fp in done for part in prints for fp in part)
    fields = [str(c) for c in inputs.columns]
    job.frame_spec = {"fields": fields, "nodes": [n.id for n in job.flow.workflow.nodes.values()
                                                  if n.status != Status.PRUNED]}
    job.drive(client, Units(job.state.workers, [("partition", n, datas[n], prints[n],
                              {fp: dict(done[fp], resumed=True) for fp in prints[n] if fp in done})
                             for n in range(len(datas))]))
    for unit in job.not_run:   # past the budget: their rows say so, resumed ones are kept
        job.frames[unit[1]] = job.partition(client, unit, (RunState.SKIPPED, NOT_RUN))
    frames = [job.frames[n] for n in range(len(datas))]
    job.report(job.state)
    if job.opened:   # the cluster goes with this map: bring the partitions here first
        return dd.from_pandas(pd.concat(client.gather(frames)), npartitions=len(frames),
                              sort=False)
    meta = client.submit(_head, frames[0]).result()
    return dd.from_delayed(frames, meta=meta, divisions=inputs.divisions, verify_meta=False)


class _Job:
    """One map's driver side: submits units (a chunk of inputs, or a partition of a Dask
    DataFrame) a few per worker at a time, merges each result into the user's store as it
    arrives."""

    def __init__(self, flow, payload: bytes, keys: dict, report, budget_usd):
        self.flow, self.payload, self.keys = flow, payload, keys
        self.tag = hashlib.sha256(payload).hexdigest()[:16]
        self.nonce = os.urandom(4).hex()   # this map's partition keys, apart from the last map's
        self.report, self.budget_usd = report, budget_usd
        self.state = MapProgress(total=0, budget_usd=budget_usd)
        self.items: dict[str, dict] = {}
        self.frames: dict[int, Any] = {}    # partition -> future of its result frame
        self.frame_spec: dict = {}
        self.not_run: list[tuple] = []      # units the budget stopped
        self.opened: list = []
        self.units: Chunks | Units = Units(1, [])

    @contextlib.contextmanager
    def session(self, engine: Any, threads: int, workers: int | None, current: bool = False):
        """The cluster for this map, with its plugin (the shared payload and the keys);
        closed (what this map opened) and the plugin removed afterwards."""
        from .dask_worker import MapPlugin

        client, self.opened = _client(engine, threads, workers, current)
        plugin = MapPlugin(self.tag, self.payload, self.keys)
        try:
            if "dashboard" in client.scheduler_info().get("services", {}):
                self.state.dashboard = client.dashboard_link
            self.state.workers = max(1, len(client.scheduler_info()["workers"]))
            client.register_plugin(plugin, name=plugin.name)
            yield client
        finally:
            try:
                client.unregister_worker_plugin(plugin.name)
            except Exception:   # a closed or restarted cluster forgets its plugins anyway
                pass
            for thing in self.opened:
                thing.close()

    def drive(self, client, units: "Chunks | Units") -> None:
        """Submit the units while they have room (`units.room`: the next ones wait on the
        worker, so a slow round trip to this driver leaves no worker idle), collect each
        as it finishes; the budget stops the submitting."""
        from dask.distributed import as_completed

        running, pending = as_completed(), {}
        self.units = units

        def submit_more() -> None:
            while units and units.room(list(pending.values())):
                if self.budget_usd is not None and self.state.cost_usd >= self.budget_usd:
                    self.not_run = units.rest()
                    return
                unit = units.take()
                future = self._submit(client, unit)
                pending[future] = unit
                running.add(future)

        try:
            submit_more()
            for future in running:
                self._collect(client, future, pending.pop(future))
                self.report(self.state)
                submit_more()
        finally:
            if pending:
                client.cancel(list(pending))

    def partition(self, client, unit: tuple, not_run: tuple[str, str] | None = None):
        """The future of a partition's task (its runs and its result frame), or, with
        `not_run` (state, why), of a frame saying so."""
        from .dask_worker import run_partition

        _, number, data, prints, resumed = unit
        key = f"flowmagic-{self.nonce}-part-{number}" + ("-not-run" if not_run else "")
        return client.submit(run_partition, self.tag, data, number, prints,
                             resumed, self.frame_spec, not_run, key=key, retries=2)

    def _submit(self, client, unit: tuple):
        from operator import getitem

        from .dask_worker import run_chunk

        if unit[0] == "chunk":
            chunk = unit[1]   # its key: its inputs, so a task Dask retried is merged once
            key = hashlib.sha256("".join(fp for fp, _, _ in chunk).encode()).hexdigest()[:32]
            return client.submit(run_chunk, self.tag, chunk, key=f"flowmagic-{key}", retries=2)
        both, key = self.partition(client, unit), f"flowmagic-{self.nonce}-part-{unit[1]}"
        self.frames[unit[1]] = client.submit(getitem, both, "frame", key=f"{key}-frame",
                                             retries=2)
        return client.submit(getitem, both, "results", key=f"{key}-runs", retries=2)

    def _collect(self, client, future, unit: tuple) -> None:
        """Merge what one unit ran into the user's store in one commit (done inputs marked
        for resume)."""
        try:
            results = future.result()
        except Exception as exc:   # the task itself broke (a bug, or its workers kept dying)
            error = f"{type(exc).__name__}: {exc}"
            if unit[0] == "chunk":
                for fp, _, _ in unit[1]:
                    self.items[fp] = {"state": RunState.FAILED, "error": error}
                self.state.failed += len(unit[1])
            else:
                self.frames[unit[1]] = self.partition(client, unit, (RunState.FAILED, error))
                self.state.failed += len(unit[3]) - len(unit[4])
            return
        if unit[0] == "chunk":
            results = results["results"]
            self.units.learn([r["item"] for r in results])
        self.flow.store.merge_many([
            (r["export"], r["fingerprint"] if r["item"]["state"] == RunState.DONE else None, r["item"])
            for r in results if r["export"] is not None])
        for result in results:
            item = result["item"]
            self.items[result["fingerprint"]] = item
            self.state.cost_usd += float(item.get("cost_usd") or 0.0)
            if item["state"] == RunState.DONE:
                self.state.done += 1
            else:
                self.state.failed += 1


def _head(frame):
    return frame.iloc[:0]

