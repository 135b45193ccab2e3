"""`flow.map(inputs, engine="dask")`: the batch of flowmagic.ops.batch on a Dask cluster.

Where the engine comes from: a `dask.distributed.Client` passed as `engine=`; else the
scheduler address in `FLOWMAGIC_DASK` (``tcp://host:8786``); else a LocalCluster of worker
processes (one per core) started for this map and closed after it. Dask schedules: the
distinct inputs go in chunks, one task per chunk of up to `concurrency` inputs (a worker runs
that many at once); the driver submits two chunks per worker at a time (so a budget can stop
it), merges each finished chunk's runs into the user's store in one commit as it arrives,
and puts the rows back in input order. What runs on a worker is in
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

import dataclasses
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ConfigError
from .batch import canonical, fingerprint, fresh_copy

if TYPE_CHECKING:
    from ..flow import Flow

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
    import pandas as pd

    rows, fields = to_inputs(inputs)
    return _frame(pd, rows, fields, [item.to_dict() for item in batch])


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
                       "settings": flow.settings,
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


def _client(engine: Any, threads: int, workers: int | None):
    """(Client, what to close after the map: [client, cluster] we opened, or [])."""
    from dask.distributed import Client, LocalCluster

    address = _address(engine)
    if address is None and engine != "dask":
        return engine, []
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

    found = dict(endpoints._configured)
    if "default" not in found:
        default = endpoints.resolve_default()
        if not default.local:
            found["default"] = default
    return found


# -- the map ------------------------------------------------------------------------------------
def task_payload(flow: "Flow", found: dict, *, rpm: int | None = None,
                 at_once: int | None = None, window_s: float = 60.0,
                 concurrency: int = 4) -> bytes:
    """What every task of a map shares (pickled once, one task whose result the workers
    share): the workflow, settings, the flow's chosen tools, endpoints with their keys
    blanked (the keys go in a KeyPlugin), prices, inputs at once per worker and the
    cluster-wide limits."""
    from ..llm import endpoints

    import cloudpickle   # Dask's own: the user's tool functions from a notebook go by value

    return cloudpickle.dumps({
        "workflow": fresh_copy(flow.workflow), "name": flow.name, "settings": flow.settings,
        "tools": getattr(flow, "_tools", None),
        "endpoints": {n: dataclasses.replace(e, api_key="") for n, e in found.items()},
        "prices": dict(endpoints.PRICES), "llm_concurrency": flow.llm.concurrency,
        "rpm": rpm or flow.llm.rpm, "at_once": at_once, "window_s": window_s,
        "concurrency": concurrency})


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
    worker; `rpm` / `requests_at_once`: per endpoint,
    across the whole cluster; `budget_usd`: no new input is submitted once the list-price
    cost of this map reaches it; `progress`: True (a line on stderr), False, or a function
    called with a MapProgress after each result. A Dask DataFrame is run partition by
    partition where each partition is (its rows are not gathered to the driver first)."""
    import pandas as pd

    _check(engine, concurrency, rpm, requests_at_once, budget_usd, workers)
    found = _endpoints()
    base = _base(flow, found)
    threads = int(concurrency or 4)
    report = _reporter(progress)
    job = _Job(flow, task_payload(flow, found, rpm=rpm, at_once=requests_at_once,
                                  window_s=window_s, concurrency=threads),
               {n: e.api_key for n, e in found.items() if e.api_key}, report, budget_usd)
    if _is_dask_frame(inputs):
        fields = [str(c) for c in inputs.columns]
        parts = inputs.to_delayed()
        done = flow.store.map_fingerprints()
        job.run(engine, threads, workers, [("partition", n, part, base, done)
                                  for n, part in enumerate(parts)])
        rows = [r for n in range(len(parts)) for r in job.rows.get(n, [])]
        prints = [fp for n in range(len(parts)) for fp in job.prints.get(n, [])]
        resumed = [fp for fp in prints if fp in done and fp not in job.items]
        job.items.update({fp: dict(item, resumed=True)
                          for fp, item in flow.store.map_done(resumed).items()})
    else:
        rows, fields = to_inputs(inputs)
        if not rows:
            raise ConfigError("map() needs at least one input")
        prints = [fingerprint(base, x) for x in rows]
        job.items.update({fp: dict(item, resumed=True) for fp, item in
                          flow.store.map_done(list(dict.fromkeys(prints))).items()})
        job.state.total = len(rows)
        job.state.resumed = sum(fp in job.items for fp in prints)
        first = {fp: i for i, fp in reversed(list(enumerate(prints)))}
        job.run(engine, threads, workers, [("input", fp, first[fp], rows[first[fp]])
                                  for fp in first if fp not in job.items])
    job.state.skipped = sum(fp not in job.items for fp in prints)
    report(job.state)
    return _frame(pd, rows, fields, [job.items.get(fp) for fp in prints])


class _Job:
    """One map's driver side: submits units (an input, or a partition of a Dask DataFrame)
    in a window, merges each result into the user's store as it arrives."""

    def __init__(self, flow, payload: bytes, keys: dict, report, budget_usd):
        self.flow, self.payload, self.keys = flow, payload, keys
        self.tag = hashlib.sha256(payload).hexdigest()[:16]
        self.report, self.budget_usd = report, budget_usd
        self.state = MapProgress(total=0, budget_usd=budget_usd)
        self.items: dict[str, dict] = {}
        self.rows: dict[int, list] = {}     # partition -> its rows (Dask DataFrame inputs)
        self.prints: dict[int, list] = {}   # partition -> its rows' fingerprints

    def run(self, engine: Any, threads: int, workers: int | None, units: list[tuple]) -> None:
        if not units:
            return
        from dask.distributed import as_completed

        from .dask_worker import KeyPlugin

        client, opened = _client(engine, threads, workers)
        if "dashboard" in client.scheduler_info().get("services", {}):
            self.state.dashboard = client.dashboard_link
        plugin = KeyPlugin(self.tag, self.keys)
        pending: dict[Any, tuple] = {}
        try:
            client.register_plugin(plugin, name=plugin.name)
            # A task, not scattered data: if the worker holding it dies, Dask makes it again.
            shipped = client.submit(_given, self.payload, key=f"flowmagic-payload-{self.tag}",
                                    pure=False)
            workers = self.state.workers = max(1, len(client.scheduler_info()["workers"]))
            if units[0][0] == "input":
                units = _chunks(units, threads, workers)
            # Two units per worker: one runs while the next is on its way.
            queue, running, window = list(units), as_completed(), 2 * workers

            def submit_more() -> None:
                while queue and len(pending) < window:
                    if self.budget_usd is not None and self.state.cost_usd >= self.budget_usd:
                        queue.clear()   # the rows left are reported as not run
                        return
                    unit = queue.pop(0)
                    future = self._submit(client, shipped, unit)
                    pending[future] = unit
                    running.add(future)

            submit_more()
            for future in running:
                self._collect(future, pending.pop(future))
                self.report(self.state)
                submit_more()
        finally:
            if pending:
                client.cancel(list(pending))
            try:
                client.unregister_worker_plugin(plugin.name)
            except Exception:   # a closed or restarted cluster forgets its plugins anyway
                pass
            for thing in opened:
                thing.close()

    def _submit(self, client, shipped, unit: tuple):
        from .dask_worker import run_chunk, run_partition

        if unit[0] == "chunk":
            chunk = unit[1]   # its key: its inputs, so a task Dask retried is merged once
            key = hashlib.sha256("".join(fp for fp, _, _ in chunk).encode()).hexdigest()[:32]
            return client.submit(run_chunk, shipped, self.tag, chunk, key=f"flowmagic-{key}",
                                 retries=2)
        _, number, part, base, done = unit
        data = client.compute(part)   # stays on the worker that makes it
        return client.submit(run_partition, shipped, self.tag, base, done, data, number,
                             key=f"flowmagic-{self.tag}-part-{number}", retries=2)

    def _collect(self, future, unit: tuple) -> None:
        """Merge what one unit ran into the user's store in one commit (done inputs marked
        for resume)."""
        try:
            answer = future.result()
        except Exception as exc:   # the task itself broke (a bug, or its workers kept dying)
            if unit[0] == "chunk":
                for fp, _, _ in unit[1]:
                    self.items[fp] = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}
                self.state.failed += len(unit[1])
                return
            raise
        if unit[0] == "partition":
            self.rows[unit[1]] = answer["rows"]
            self.state.total += len(answer["rows"])   # known as partitions come back
            self.prints[unit[1]] = [r["fingerprint"] for r in answer["results"]]
        ran = [r for r in answer["results"] if not r.get("resumed")]
        self.state.resumed += len(answer["results"]) - len(ran)
        self.flow.store.merge_many([
            (r["export"], r["fingerprint"] if r["item"]["state"] == "done" else None, r["item"])
            for r in ran if r["export"] is not None])
        for result in ran:
            item = result["item"]
            self.items[result["fingerprint"]] = item
            self.state.cost_usd += float(item.get("cost_usd") or 0.0)
            if item["state"] == "done":
                self.state.done += 1
            else:
                self.state.failed += 1


def _chunks(units: list[tuple], threads: int, workers: int) -> list[tuple]:
    """Inputs grouped into tasks: up to `threads` inputs (what one worker runs at once) per
    task, fewer when there are few inputs, so every worker still gets several tasks."""
    size = max(1, min(threads, -(-len(units) // (4 * workers))))
    return [("chunk", [u[1:] for u in units[i:i + size]]) for i in range(0, len(units), size)]


def _given(payload: bytes) -> bytes:
    return payload


def _frame(pd, rows: list, fields: list[str], items: list[dict | None]):
    node_ids: list[str] = []
    for item in items:
        node_ids += [n for n in (item or {}).get("outputs", {}) if n not in node_ids]
    table = []
    for example, item in zip(rows, items):
        item = item or {"state": "skipped", "error": "not run: the map's budget was reached"}
        row = dict(example) if fields else {"input": example}
        row.update(result=item.get("result"), status=item["state"],
                   tokens_in=item.get("tokens_in", 0), tokens_out=item.get("tokens_out", 0),
                   cost_usd=item.get("cost_usd", 0.0), time_s=item.get("duration_s", 0.0),
                   error=item.get("error"), run_id=item.get("run_id"),
                   resumed=bool(item.get("resumed")))
        row.update({f"node:{n}": (item.get("outputs") or {}).get(n) for n in node_ids})
        table.append(row)
    return pd.DataFrame(table)
