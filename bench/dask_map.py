"""Inputs per second of `flow.map`: the in-process engine against Dask with 1 and 2 worker
processes, for an I/O-bound workflow (loopback latency 200 ms) and a CPU-bound one (each
input's node calls a pure-Python tool that computes for ~0.2 s). Not a test: run it when the
machine is quiet, `python bench/dask_map.py`; it prints a table and rewrites its own
section of bench/RESULTS.md (between the dask-map markers), nothing else.

The loopback server runs in a process of its own so it does not share the driver's GIL.
Each run has a fresh store and LLM of its own (the process-wide LLM would keep the first
run's store, and its cache would answer the later runs), so nothing is answered from the
cache or resumed; every answer of the CPU-bound run must carry its tool's result. Cluster
start-up is timed apart: a user's long-lived cluster does not pay it per map.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
BEGIN, END = "<!-- dask-map:begin -->", "<!-- dask-map:end -->"
PLAN = {"nodes": [{"id": "ask", "requirement": "Look up {{city}} and report its population"}],
        "edges": []}
ASKED = re.compile(r"Look up (c\d+)")
WARM = 100_000   # the warm-up maps' inputs are c100000, c100001, ...
DRIVER_CPU_MS: dict[str, float] = {}   # this process's CPU per input of the last map


def crunch(city: str) -> str:
    """The population of a city (computed the slow way: ~0.2 s of pure Python)."""
    total = 0
    for i in range(1_500_000):
        total = (total + i * i) % 1_000_003
    return f"{city}: {total}"


def responder(body: dict):
    said = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    found = ASKED.search(str(body["messages"]))
    city = found.group(1) if found else "?"
    if body.get("tools") and not said:
        return {"tool_calls": [{"function": {"name": "crunch",
                                             "arguments": json.dumps({"city": city})}}]}
    return f"{city} looked up ({said[-1] if said else 'no tool'})"


def _serve(conn, latency: float) -> None:
    from flowmagic.testing.loopback import LoopbackServer
    with LoopbackServer(responder=responder, latency=latency) as server:
        conn.send(server.base_url)
        conn.recv()


def _warm() -> None:
    import flowmagic.flow  # noqa: F401
    import flowmagic.ops.dask_worker  # noqa: F401
    import flowmagic.ops.batch  # noqa: F401


def _one(engine, n: int, threads: int, cpu: bool, base_url: str, first: int = 0) -> float:
    import flowmagic
    from flowmagic.flow import Flow
    from flowmagic.llm import endpoints
    from flowmagic.llm.client import LLM
    from flowmagic.store import Store

    os.environ["FLOWMAGIC_HOME"] = tempfile.mkdtemp(prefix="bench-dask-")
    endpoints.reset()
    flowmagic.configure(base_url=base_url, model="loopback", self_hosted=False)
    llm = LLM(Store(os.path.join(os.environ["FLOWMAGIC_HOME"], "flowmagic.db")))
    flow = Flow.from_dict(PLAN, task="look up cities", llm=llm)
    flow.tools = [crunch] if cpu else []
    inputs = [{"city": f"c{i}"} for i in range(first, first + n)]
    started, cpu_started = time.perf_counter(), time.process_time()
    if engine == "inprocess":
        out = flow.map(inputs, concurrency=threads)
        results = [item.result if item.state == "done" else item.error for item in out]
    else:
        out = flow.map(inputs, engine=engine, concurrency=threads, progress=False)
        results = [r if s == "done" else e
                   for r, s, e in zip(out["result"], out["status"], out["error"])]
    elapsed = time.perf_counter() - started
    DRIVER_CPU_MS[engine if engine == "inprocess" else "dask"] = (
        1000 * (time.process_time() - cpu_started) / n)
    ok = sum(r is not None and (f"(c{i}: " in r if cpu else "looked up" in r)
             for i, r in zip(range(first, first + n), results))
    if ok != n:
        raise SystemExit(f"bench: only {ok}/{n} inputs finished (with the tool's result) "
                         f"on {engine}; the first answer or error: {results[0]!r}")
    return n / elapsed


def run(n_io: int, n_cpu: int, threads: int) -> dict:
    from dask.distributed import Client, LocalCluster

    results: dict = {"load_before": os.getloadavg()[0]}
    for kind, n, latency in (("io", n_io, 0.2), ("cpu", n_cpu, 0.0)):
        parent, child = mp.Pipe()
        server = mp.get_context("spawn").Process(target=_serve, args=(child, latency), daemon=True)
        server.start()
        base_url = parent.recv()
        try:
            # Every engine maps a few other inputs first: the first map in a process pays
            # its imports and first connections once, as a live kernel or cluster has.
            _one("inprocess", 8, threads, kind == "cpu", base_url, first=WARM)
            row = {"inprocess": _one("inprocess", n, threads, kind == "cpu", base_url)}
            for workers in (1, 2):
                started = time.perf_counter()
                with LocalCluster(n_workers=workers, threads_per_worker=threads // workers,
                                  processes=True, dashboard_address=None) as cluster, \
                        Client(cluster) as client:
                    client.run(_warm)
                    _one(client, 4 * threads, threads // workers, kind == "cpu", base_url,
                         first=WARM)
                    row[f"startup_{workers}"] = time.perf_counter() - started
                    row[f"dask_{workers}"] = _one(client, n, threads // workers, kind == "cpu",
                                                  base_url)
                    row[f"driver_ms_{workers}"] = DRIVER_CPU_MS["dask"]
            row["n"] = n
            results[kind] = row
        finally:
            parent.send("stop")
            server.join(10)
    results["load_after"] = os.getloadavg()[0]
    return results


def table(r: dict, threads: int) -> str:
    lines = [f"One run, {time.strftime('%Y-%m-%d %H:%M')}, load {r['load_before']:.1f} before and "
             f"{r['load_after']:.1f} after (1-minute average, 2 cores), {threads} inputs in "
             "flight in every engine.", "",
             "| workflow | inputs | in process /s | Dask 1 worker /s | Dask 2 workers /s | "
             "1 worker / in process | 2 workers / in process | 2 workers / 1 worker |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    names = {"io": "I/O-bound (200 ms latency)", "cpu": "CPU-bound (0.2 s tool per input)"}
    for kind in ("io", "cpu"):
        x = r[kind]
        lines.append(f"| {names[kind]} | {x['n']} | {x['inprocess']:.2f} | {x['dask_1']:.2f} | "
                     f"{x['dask_2']:.2f} | {x['dask_1'] / x['inprocess']:.2f} | "
                     f"{x['dask_2'] / x['inprocess']:.2f} | {x['dask_2'] / x['dask_1']:.2f} |")
    lines += ["", "The driver's own CPU per input on Dask (the process that submits, merges "
              "into the store and builds the frame): " + ", ".join(
                  f"{names[k].split(' (')[0]} {r[k]['driver_ms_1']:.1f} ms (1 worker) / "
                  f"{r[k]['driver_ms_2']:.1f} ms (2 workers)" for k in ("io", "cpu")) + "."]
    lines += ["", "LocalCluster start-up, worker imports and a first map of "
              f"{4 * threads} inputs (not in the rates): 1 worker {r['io']['startup_1']:.1f} s, "
              f"2 workers {r['io']['startup_2']:.1f} s."]
    return "\n".join(lines)


def write(text: str) -> None:
    from report import write_section

    write_section(RESULTS, BEGIN, END, "Distributed map (issue 16)", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-io", type=int, default=256)
    parser.add_argument("--n-cpu", type=int, default=48)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    text = table(run(args.n_io, args.n_cpu, args.threads), args.threads)
    print(text)
    if not args.no_write:
        write(text)


if __name__ == "__main__":
    main()
