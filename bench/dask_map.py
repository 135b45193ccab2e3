"""Inputs per second of `flow.map`: the in-process engine against Dask with 1 and 2 worker
processes, for an I/O-bound workflow (loopback latency 200 ms) and a CPU-bound one (each
input's node calls a pure-Python tool that computes for ~0.1-0.2 s). Not a test: run it
as `python bench/dask_map.py`; it prints a table and rewrites its own section of
bench/RESULTS.md (between the dask-map markers), nothing else.

Every engine is called as a user calls it, with the same `concurrency` (`--threads`, 8):
inputs at once in the process, or per worker on Dask, so 2 workers run twice as many as
one process (the point of adding a worker to I/O-bound model calls; the endpoint's own
limits hold across the cluster, and the loopback server here sets none). One more Dask
run gives each of 2 workers half of it (4 + 4: as many in flight as in process), which
measures the engine's own cost apart from what the extra inputs in flight bring.

The engines take turns, round after round (in process, 2 workers, 2 workers at half, 1
worker, then the other way round), and each round's ratios are taken between its own runs,
so a load that comes and goes on a shared machine shows as the spread of the ratios
(median, min and max reported) rather than as a bias against whichever engine ran last.
Every engine's answers must be the in-process engine's, input for input.

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
import statistics
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


def _one(engine, n: int, threads: int, cpu: bool, base_url: str,
         first: int = 0) -> tuple[float, list]:
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
    return n / elapsed, results


# The Dask runs: name -> (workers, share of `--threads` each worker runs at once).
DASK = {1: (1, 1), 2: (2, 1), "half": (2, 2)}


def _on_dask(engine, n: int, threads: int, cpu: bool, base_url: str) -> dict:
    """One map on a LocalCluster started for it, as flowmagic starts one (a Dask thread per
    input at once), and a warm-up map timed apart as the start-up: a user's long-lived
    cluster does not pay it per map."""
    from dask.distributed import Client, LocalCluster

    workers, share = DASK[engine]
    started = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=threads // share,
                      processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.run(_warm)
        _one(client, 4 * threads, threads // share, cpu, base_url, first=WARM)
        startup = time.perf_counter() - started
        rate, results = _one(client, n, threads // share, cpu, base_url)
    return {"rate": rate, "results": results, "startup": startup,
            "driver_ms": DRIVER_CPU_MS["dask"]}


def _round(number: int, n: int, threads: int, cpu: bool, base_url: str) -> dict:
    """In process, 2 workers, 2 workers at half, 1 worker (every other round the other way
    round)."""
    order = ["inprocess", 2, "half", 1]
    got: dict = {"load": os.getloadavg()[0]}
    for engine in order if number % 2 == 0 else order[::-1]:
        if engine == "inprocess":
            rate, results = _one("inprocess", n, threads, cpu, base_url)
            got["inprocess"] = {"rate": rate, "results": results}
        else:
            got[engine] = _on_dask(engine, n, threads, cpu, base_url)
    for engine in DASK:
        if got[engine]["results"] != got["inprocess"]["results"]:
            raise SystemExit(f"bench: Dask ({_LABEL[engine]}) answered otherwise than the "
                             "in-process engine")
    return got


def run(n_io: int, n_cpu: int, threads: int, rounds: int) -> dict:
    results: dict = {"load_before": os.getloadavg()[0], "rounds": rounds}
    for kind, n, latency in (("io", n_io, 0.2), ("cpu", n_cpu, 0.0)):
        parent, child = mp.Pipe()
        server = mp.get_context("spawn").Process(target=_serve, args=(child, latency), daemon=True)
        server.start()
        base_url = parent.recv()
        try:
            # Every engine maps a few other inputs first: the first map in a process pays
            # its imports and first connections once, as a live kernel or cluster has.
            _one("inprocess", 8, threads, kind == "cpu", base_url, first=WARM)
            results[kind] = {"n": n, "rounds": [_round(r, n, threads, kind == "cpu", base_url)
                                                for r in range(rounds)]}
        finally:
            parent.send("stop")
            server.join(10)
    results["load_after"] = os.getloadavg()[0]
    return results


def _ratios(rounds: list[dict], a, b) -> list[float]:
    return [r[a]["rate"] / r[b]["rate"] for r in rounds]


def _spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
            if len(values) > 1 else f"{values[0]:.2f}")


NAMES = {"io": "I/O-bound (200 ms latency)", "cpu": "CPU-bound (tool per input)"}
_LABEL = {1: "1 worker", 2: "2 workers", "half": "2 workers at half"}


def _row(kind: str, x: dict) -> str:
    rounds, engines = x["rounds"], ("inprocess", 1, 2, "half")
    rate = {e: statistics.median(y[e]["rate"] for y in rounds) for e in engines}
    cells = [NAMES[kind], str(x["n"])] + [f"{rate[e]:.2f}" for e in engines]
    cells += [_spread(_ratios(rounds, e, "inprocess")) for e in DASK]
    return "| " + " | ".join(cells) + " |"


def _round_by_round(kind: str, x: dict, engine) -> str:
    ratios = _ratios(x["rounds"], engine, "inprocess")
    return f"{NAMES[kind].split(' (')[0]} " + ", ".join(
        f"{v:.2f} (load {y['load']:.1f})" for v, y in zip(ratios, x["rounds"]))


def _driver(kind: str, x: dict) -> str:
    return f"{NAMES[kind].split(' (')[0]} " + " / ".join(
        f"{statistics.median(y[e]['driver_ms'] for y in x['rounds']):.1f} ms ({_LABEL[e]})"
        for e in DASK)


def table(r: dict, threads: int) -> str:
    loads = [y["load"] for k in ("io", "cpu") for y in r[k]["rounds"]]
    startup = {w: statistics.median(y[w]["startup"] for y in r["io"]["rounds"]) for w in (1, 2)}
    by_round = {e: "; ".join(_round_by_round(k, r[k], e) for k in ("io", "cpu"))
                for e in (2, "half")}
    return "\n".join([
        f"One run, {time.strftime('%Y-%m-%d %H:%M')}, {r['rounds']} rounds per workflow, load "
        f"{r['load_before']:.1f} before, {min(loads):.1f}-{max(loads):.1f} at the rounds' starts, "
        f"{r['load_after']:.1f} after (1-minute average, 2 cores). Every engine is called with "
        f"concurrency={threads}: {threads} inputs at once in process and on 1 worker, "
        f"{2 * threads} on 2 workers ({threads} each: concurrency is per worker); \"2 workers "
        f"at half\" gives each {threads // 2} ({threads} in flight, as in process). Rates are "
        "medians over the rounds; ratios are taken within each round, as median (min-max).", "",
        "| workflow | inputs | in process /s | Dask 1 worker /s | Dask 2 workers /s | "
        "Dask 2 workers at half /s | 1 worker / in process | 2 workers / in process | "
        "2 workers at half / in process |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *[_row(k, r[k]) for k in ("io", "cpu")], "",
        f"2 workers / in process, round by round: {by_round[2]}. 2 workers at half / in "
        f"process: {by_round['half']}.", "",
        "The driver's own CPU per input on Dask (the process that submits, merges into the "
        "store and builds the frame; a LocalCluster's scheduler runs in it too), median: "
        + ", ".join(_driver(k, r[k]) for k in ("io", "cpu")) + ".", "",
        f"LocalCluster start-up, worker imports and a first map of {4 * threads} inputs (not "
        f"in the rates), median: 1 worker {startup[1]:.1f} s, 2 workers {startup[2]:.1f} s."])


def write(text: str) -> None:
    from report import write_section

    write_section(RESULTS, BEGIN, END, "Distributed map (issue 16)", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-io", type=int, default=256)
    parser.add_argument("--n-cpu", type=int, default=48)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    text = table(run(args.n_io, args.n_cpu, args.threads, args.rounds), args.threads)
    print(text)
    if not args.no_write:
        write(text)


if __name__ == "__main__":
    main()
