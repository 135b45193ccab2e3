"""The flowmagic benchmark: `make bench`, or `.venv/bin/python bench/run.py [--quick]`.

Starts a loopback OpenAI-compatible server in its own process (latency a hash of the
request body in a range), runs the DAG families under flowmagic, a level-synchronous
baseline and LangGraph, measures scheduler overhead, drawing, replay and memory; then
issue 31's figures (bench/speed.py): cached tokens in the cost table, `flow.map` on Dask
against in process, and whole flows on the embedded model (csv_eda before and after, a
dabench-dev sample: prompt tokens evaluated / sent); and writes bench/RESULTS.md. See
bench/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# Before flowmagic is imported: nothing the benchmark does may touch the user's store.
os.environ["FLOWMAGIC_HOME"] = tempfile.mkdtemp(prefix="fm-bench-home-")

import clientprofile  # noqa: E402
import compare  # noqa: E402
import extras  # noqa: E402
import overhead  # noqa: E402
import report  # noqa: E402
import results  # noqa: E402
import speed  # noqa: E402
from compare import Case  # noqa: E402

__all__ = ["main"]

T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {message}", flush=True)


def _plan(quick: bool) -> dict:
    if quick:
        return {"cases": [Case("chain", 10), Case("fan", 20), Case("layered", 20, 0),
                          Case("layered", 100, 0)],
                "overhead": [(1000, 2), (2000, 1)], "memory": 2000, "draw": [100],
                "replay": 10, "faults": 20, "profile": ("fan", 20)}
    return {"cases": [Case("chain", 50), Case("chain", 100), Case("fan", 20), Case("fan", 200),
                      Case("fan", 500)]
                     + [Case("layered", n, s) for n in (100, 500) for s in (0, 1)],
            "overhead": [(1000, 5), (10000, 2)], "memory": 10000, "draw": [100, 500],
            "replay": 50, "faults": 100, "profile": ("fan", 500)}


def run_makespans(plan: dict, server) -> list:
    log("makespans: warming up")
    compare.warm_up(server, log=log)
    rows = []
    for i, case in enumerate(plan["cases"]):
        log(f"makespans: {case.name}")
        rows.append(compare.run_case(case, server, i, log=log))
    return rows


def run_overhead(plan: dict) -> dict:
    out: dict = {"flowmagic": [], "langgraph": [], "executor": [], "node_runner": []}
    for n, repeats in plan["overhead"]:
        log(f"overhead: {n} nodes through the node runner and LLM door (best of {repeats})")
        out["node_runner"].append(overhead.node_runner_overhead(n, repeats))
        log(f"    {out['node_runner'][-1]['run_ms']:.3f} ms/node run")
        log(f"overhead: {n} nodes, flowmagic (best of {repeats})")
        out["flowmagic"].append(overhead.flowmagic_overhead(n, repeats))
        log(f"    {out['flowmagic'][-1]['run_ms']:.3f} ms/node run, "
            f"{out['flowmagic'][-1]['total_ms']:.3f} ms/node with the build")
        log(f"overhead: {n} nodes, flowmagic executor without hooks")
        out["executor"].append(overhead.executor_only(n, repeats))
        log(f"overhead: {n} nodes, LangGraph (best of {repeats})")
        out["langgraph"].append(overhead.langgraph_overhead(n, repeats))
        log(f"    {out['langgraph'][-1]['run_ms']:.3f} ms/node run, "
            f"{out['langgraph'][-1]['total_ms']:.3f} ms/node with the compile")
    return out


def run_memory(n: int) -> list[dict]:
    rows = []
    # LangGraph under tracemalloc takes minutes at 10,000 nodes: its peak RSS is enough.
    for lg, traced in ((False, True), (False, False), (True, False)):
        runner = "LangGraph" if lg else "flowmagic"
        log(f"memory: {n} nodes, {runner}, {'tracemalloc' if traced else 'peak RSS only'} (child process)")
        try:
            rows.append(overhead.memory_in_child(n, langgraph=lg, traced=traced))
        except (RuntimeError, OSError, ValueError) as exc:
            rows.append({"n": n, "runner": runner.lower(), "traced": traced, "error": str(exc)})
        log(f"    {rows[-1]}")
    return rows


PARTS: list[dict] = []   # each part of the run: seconds, and the load before and after it


@contextlib.contextmanager
def part(name: str):
    """Time one part of the run with the 1-minute load before and after it (RESULTS.md's
    table of parts: how long each takes, and on how busy a machine)."""
    load, started = os.getloadavg()[0], time.perf_counter()
    yield
    PARTS.append({"part": name, "seconds": time.perf_counter() - started,
                  "load_before": load, "load_after": os.getloadavg()[0]})


def _args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, for checking the harness")
    p.add_argument("--latency", default="0.05:0.5", help="server latency range lo:hi in seconds")
    p.add_argument("--seed", type=int, default=1, help="the server's latency seed")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"))
    p.add_argument("--before", help="a folder holding the older flowmagic/ that csv_eda's "
                   "'before' runs (default: --before-ref taken from git)")
    p.add_argument("--before-ref", default=speed.BEFORE_REF,
                   help="the commit whose flowmagic/ is the older source, when this is a git "
                   "checkout that has it")
    p.add_argument("--questions", type=int, default=3,
                   help="dabench-dev questions run as flows on the embedded model (0: none)")
    p.add_argument("--model-timeout", type=float, default=600,
                   help="seconds one csv_eda flow on the embedded model may take")
    p.add_argument("--question-timeout", type=float, default=300,
                   help="seconds one dabench-dev flow may take (stopped there, its calls so far "
                   "still counted)")
    p.add_argument("--skip-model", action="store_true",
                   help="leave out the flows on the embedded model (--quick does)")
    return p.parse_args(argv)


def _loopback_parts(plan: dict, data: dict, lo: float, hi: float, seed: int) -> None:
    import flowmagic
    import server as bench_server

    with bench_server.spawn(latency=(lo, hi), seed=seed) as server:
        log(f"loopback server {server.base_url} (latency {lo}-{hi} s from a hash of the body)")
        flowmagic.configure(base_url=server.base_url, model="m", self_hosted=False)
        with part("makespans"):
            data["cases"] = run_makespans(plan, server)
        log("replay: exported notebook")
        with part("replay"):
            data["replay"] = extras.replay(plan["replay"], server, log=log)
        log(f"profile: flowmagic on {plan['profile'][0]}-{plan['profile'][1]} under cProfile")
        server.reset()
        with part("client profile"):
            data["profile"] = clientprofile.client_profile(*plan["profile"])
    log(f"faults: layered-{plan['faults']} with 5% HTTP 429 and 5% HTTP 500")
    with part("faults"):
        data["faults"] = compare.fault_case(plan["faults"], {"429": 0.05, "500": 0.05},
                                            seed=seed, latency=(lo, hi), log=log)


def _local_parts(plan: dict, data: dict) -> None:
    with part("overhead"):
        data["overhead"] = run_overhead(plan)
    log(f"profile: the node runner on layered-{plan['overhead'][0][0]} under cProfile")
    with part("node runner profile"):
        data["node_profile"] = clientprofile.node_runner_profile(plan["overhead"][0][0])
    data["drawing"] = []
    with part("drawing"):
        for n in plan["draw"]:
            log(f"drawing: {n} nodes")
            data["drawing"].append(extras.drawing_time(n))
            log(f"    {data['drawing'][-1]}")
    with part("memory"):
        data["memory"] = run_memory(plan["memory"])
    log("%load_ext flowmagic in fresh shells")
    with part("%load_ext"):
        data["load_ext"] = extras.load_ext_time()


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    lo, hi = (float(x) for x in args.latency.split(":"))
    plan = _plan(args.quick)
    info = report.machine()
    log(f"machine: {info['cores']} cores, {info['memory']}, load {info['load']}")
    data: dict = {"latency": (lo, hi), "seed": args.seed}
    _loopback_parts(plan, data, lo, hi, args.seed)
    _local_parts(plan, data)
    data["speed"] = speed.measure(vars(args), args.quick, HERE.parent, log=log, part=part)
    info["load"] += f" at the start, {'%.2f %.2f %.2f' % os.getloadavg()} at the end"
    settings = {"latency": f"{lo}-{hi} s", "server seed": args.seed,
                "mode": "quick" if args.quick else "full"}
    summary, sections, notes = results.build(data, quick=args.quick)
    summary += speed.rows(data["speed"])
    report.write_results(Path(args.out), info, summary, sections, notes, settings,
                         time.perf_counter() - T0, parts=PARTS)
    speed.write_blocks(Path(args.out), data["speed"])
    log(f"wrote {args.out}")
    for row in summary:
        log(f"  {row['what']}: {row['measured']} (target {row['target']}) "
            f"{report.verdict(row['ok'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
