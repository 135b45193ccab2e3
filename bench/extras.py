"""Measurements that depend on modules other people own: drawing and notebook replay.

Each one returns a dict with "value" and "note"; when the module it needs is not in the
package yet, the value is None and the note says "not measured: ...", so the harness
runs today and measures as soon as the module lands.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from dags import family

__all__ = ["drawing_time", "replay", "load_ext_time"]


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def _executed_flow(dag: dict, home: Path, task: str = "Benchmark workflow: drawing."):
    """A Flow of the DAG whose nodes all ran (no-op work), so the drawing has statuses and
    durations for the critical path, like a drawing after a real run."""
    from flowmagic.engine.scheduler import Executor, Outcome
    from flowmagic.flow import Flow
    from flowmagic.llm import LLM
    from flowmagic.store import Store

    async def work(node_id: str) -> Outcome:
        await asyncio.sleep(0)
        return Outcome(ok=True, output=f"result of {node_id}")

    store = Store(home / "flowmagic.db")
    flow = Flow.from_dict(dag, task=task, llm=LLM(store), store=store, consolidate=False)
    asyncio.run(Executor(flow.workflow, work, concurrency=None).run())
    return flow


_LOAD_EXT = ("import sys, time; from IPython.core.interactiveshell import InteractiveShell;"
             "from traitlets.config import Config; c = Config(); c.HistoryManager.hist_file=':memory:';"
             "ip = InteractiveShell.instance(config=c); t = time.perf_counter();"
             "ip.run_line_magic('load_ext', 'flowmagic'); print(time.perf_counter() - t)")


def load_ext_time(repeats: int = 5) -> dict:
    """Seconds `%load_ext flowmagic` takes in a fresh IPython shell (the best of `repeats`
    fresh interpreters: each one imports flowmagic cold)."""
    import sys

    times = [float(subprocess.run([sys.executable, "-c", _LOAD_EXT], capture_output=True,
                                  text=True, check=True).stdout.split()[-1])
             for _ in range(repeats)]
    return {"value": min(times), "median": sorted(times)[len(times) // 2]}


def _dot_alone(source: str) -> float:
    """Seconds for graphviz's `dot -Tsvg` on the DOT text alone (layout and SVG writing)."""
    t0 = time.perf_counter()
    subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True, check=True)
    return time.perf_counter() - t0


def drawing_time(n: int, repeats: int = 3) -> dict:
    """Seconds for `render.svg(workflow)` (DOT built, laid out by `dot`, SVG returned), and
    the two parts apart: building the DOT text in Python, and `dot` on that text."""
    render = _module("flowmagic.view.render")
    if render is None or not hasattr(render, "svg"):
        return {"n": n, "value": None, "note": "not measured: flowmagic.view.render.svg not built yet"}
    if hasattr(render, "have_dot") and not render.have_dot():
        return {"n": n, "value": None, "note": "not measured: graphviz's dot is not installed"}
    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        flow = _executed_flow(family("layered", n), Path(tmp))
        times, builds, dots, size = [], [], [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = render.svg(flow.workflow)
            times.append(time.perf_counter() - t0)
            size = len(out)
            if hasattr(render, "draw"):
                t0 = time.perf_counter()
                source = render.draw(flow.workflow).source
                builds.append(time.perf_counter() - t0)
                dots.append(_dot_alone(source))
        flow.store.close()
    ok = "<svg" in out
    return {"n": n, "value": min(times), "times": times, "svg_chars": size,
            "dot_build_s": min(builds, default=None), "dot_only_s": min(dots, default=None),
            "note": "" if ok else "render.svg returned no <svg> (DOT fallback?)"}


def replay(n: int, server, *, max_tokens: int = 64, log=print) -> dict:
    """Run an n-node flow against the server, export it as a notebook, then execute the
    notebook in a fresh kernel with the same FLOWMAGIC_HOME: model calls and seconds."""
    notebook = _module("flowmagic.ops.export")
    if notebook is None:
        return {"n": n, "value": None, "calls": None,
                "note": "not measured: exporter not built yet (flowmagic.ops.export is missing)"}
    if not hasattr(notebook, "export"):
        return {"n": n, "value": None, "calls": None,
                "note": "not measured: flowmagic.ops.export.export is missing"}
    with tempfile.TemporaryDirectory(prefix="fm-bench-replay-") as tmp:
        return _replay_in(Path(tmp), n, server, max_tokens, log, notebook)


@contextmanager
def _environ(**values: str):
    """Set environment variables for the block (a kernel started inside inherits them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run_and_export(tmp: Path, n: int, server, max_tokens: int, notebook):
    import flowmagic
    from flowmagic.flow import Flow
    from flowmagic.llm import LLM
    from flowmagic.store import Store

    flowmagic.configure(base_url=server.base_url, model="m", self_hosted=False)
    store = Store(tmp / "home" / "flowmagic.db")
    flow = Flow.from_dict(family("layered", n), task="Benchmark workflow: replay.",
                          llm=LLM(store), store=store, consolidate=False,
                          concurrency=1_000_000, max_tokens=max_tokens)
    flow.run()
    path = tmp / "replay.ipynb"
    # Flow.to_notebook(path) is the public door; notebook.export(flow, path) is what it calls.
    export = getattr(flow, "to_notebook", None) or (lambda p: notebook.export(flow, p))
    export(str(path))
    return store, path


def _execute(path: Path, tmp: Path) -> tuple[int, float, float, list]:
    """(cells, kernel start s, cells s, [(s, index, first line)]) for one nbclient run."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp)}})
    t0 = time.perf_counter()
    per_cell = []
    with client.setup_kernel():
        t1 = time.perf_counter()
        for index, cell in enumerate(nb.cells):
            c0 = time.perf_counter()
            client.execute_cell(cell, index)
            per_cell.append((time.perf_counter() - c0, index, _first_line(cell)))
        t2 = time.perf_counter()   # before the kernel's shutdown, which is not replay
    return len(nb.cells), t1 - t0, t2 - t1, per_cell


def _replay_in(tmp: Path, n: int, server, max_tokens: int, log, notebook) -> dict:
    # The kernel inherits these: the same store (so the same cache) and the same server.
    with _environ(FLOWMAGIC_HOME=str(tmp / "home"), FLOWMAGIC_BASE_URL=server.base_url,
                  FLOWMAGIC_MODEL="m", FLOWMAGIC_SELF_HOSTED="0"):
        store, path = _run_and_export(tmp, n, server, max_tokens, notebook)
        before = store.last_call_id()
        server.reset()
        # Twice, each in a fresh kernel: one run on a shared machine can be unlucky.
        runs = [_execute(path, tmp) for _ in range(2)]
        cells, start_s, cells_s, per_cell = min(runs, key=lambda r: r[2])
        calls = server.stats()["calls"]
        logged = store.count_calls(cached=False, since_id=before)
        store.close()
    log(f"    replay of a {n}-node notebook, twice: {calls} calls reached the server, "
        f"{logged} uncached calls logged, cells {', '.join(f'{r[2]:.2f}' for r in runs)} s "
        f"(+ kernel start {start_s:.2f} s)")
    return {"n": n, "value": cells_s, "kernel_start_s": start_s, "calls": calls,
            "runs": [r[2] for r in runs],
            "uncached_logged": logged, "cells": cells, "note": "",
            "slowest": sorted(per_cell, reverse=True)[:4],
            "node_cells_s": sum(t for t, _, line in per_cell if line.startswith("%%flow_node"))}


def _first_line(cell) -> str:
    source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
    line = source.strip().splitlines()[0] if source.strip() else ""
    return f"{cell.cell_type}: {line[:60]}" if cell.cell_type != "code" else line[:60]
